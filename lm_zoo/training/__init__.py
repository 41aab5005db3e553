"""Training, checkpoints and work directories."""

from lm_zoo.training.checkpoints import Checkpoints
from lm_zoo.training.loop import train_and_evaluate
from lm_zoo.training.metrics import MetricsWriter, read_metrics
from lm_zoo.training.optimizers import (epoch_learning_rate, make_optimizer, register_optimizer,
                                       set_learning_rate)
from lm_zoo.training.parallel import (data_mesh, initialize_distributed, shard_batch,
                                      state_shardings)
from lm_zoo.training.run import Progress, create_train_state, load_data
from lm_zoo.training.scoring import sample_text
from lm_zoo.training.stacked import train_seeds
from lm_zoo.training.steps import TrainState, make_train_step
from lm_zoo.training.trained import (evaluate_workdir, load_trained, meta_train_workdir,
                                     workdir_evaluator)
from lm_zoo.training.workdir import load_config

__all__ = [
    'Checkpoints', 'MetricsWriter', 'Progress', 'TrainState', 'create_train_state', 'data_mesh',
    'epoch_learning_rate', 'evaluate_workdir', 'initialize_distributed', 'load_config',
    'load_data', 'load_trained', 'make_optimizer', 'make_train_step', 'meta_train_workdir',
    'read_metrics', 'register_optimizer', 'sample_text', 'set_learning_rate', 'shard_batch',
    'state_shardings', 'train_and_evaluate', 'train_seeds', 'workdir_evaluator',
]
