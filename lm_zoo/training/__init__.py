"""Training, evaluation and checkpoints."""

from lm_zoo.training.checkpoints import Checkpoints
from lm_zoo.training.evaluation import (EvalResult, evaluate_stream, token_losses,
                                        tune_temperature)
from lm_zoo.training.loop import train_and_evaluate
from lm_zoo.training.metrics import MetricsWriter, read_metrics
from lm_zoo.training.optimizers import epoch_learning_rate, make_optimizer, set_learning_rate
from lm_zoo.training.parallel import (data_mesh, initialize_distributed, shard_batch,
                                      state_shardings)
from lm_zoo.training.run import Progress, create_train_state, load_data
from lm_zoo.training.scoring import evaluate_split, sample_text
from lm_zoo.training.steps import TrainState, make_eval_step, make_train_step, token_nll
from lm_zoo.training.trained import evaluate_workdir, load_trained
from lm_zoo.training.workdir import load_config

__all__ = [
    'Checkpoints', 'EvalResult', 'MetricsWriter', 'Progress', 'TrainState',
    'create_train_state', 'data_mesh', 'epoch_learning_rate', 'evaluate_split', 'evaluate_stream',
    'evaluate_workdir', 'initialize_distributed',
    'load_config', 'load_data', 'load_trained', 'make_eval_step', 'make_optimizer', 'make_train_step',
    'read_metrics', 'sample_text', 'set_learning_rate', 'shard_batch', 'state_shardings',
    'token_losses', 'token_nll', 'train_and_evaluate',
    'tune_temperature',
]
