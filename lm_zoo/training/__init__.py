"""Training: the loop (`train_and_evaluate`, of one seed or several at once),
the train step, optimizers and data parallelism; a finished
run scored (`evaluate_workdir`) or meta-trained for (`meta_train_workdir`).
The run's work directory, checkpoints and metrics are `lm_zoo.runs`."""

from lm_zoo.training.loop import train_and_evaluate
from lm_zoo.training.meta_trained import meta_train_workdir
from lm_zoo.training.optimizers import (
  epoch_learning_rate,
  make_optimizer,
  register_optimizer,
  set_learning_rate,
)
from lm_zoo.training.parallel import data_mesh, initialize_distributed, shard_batch, state_shardings
from lm_zoo.training.run import Progress, create_train_state
from lm_zoo.training.scoring import sample_text
from lm_zoo.training.steps import TrainState, make_train_step
from lm_zoo.training.trained import (
  evaluate_workdir,
  evaluate_workdirs,
  workdir_evaluator,
)

__all__ = [
  'Progress',
  'TrainState',
  'create_train_state',
  'data_mesh',
  'epoch_learning_rate',
  'evaluate_workdir',
  'evaluate_workdirs',
  'initialize_distributed',
  'make_optimizer',
  'make_train_step',
  'meta_train_workdir',
  'register_optimizer',
  'sample_text',
  'set_learning_rate',
  'shard_batch',
  'state_shardings',
  'train_and_evaluate',
  'workdir_evaluator',
]
