"""Language models built from any recurrent cell."""

from lm_zoo.models.checks import check_model_config
from lm_zoo.models.factory import (
  build_model,
  count_params,
  describe_model,
  init_params,
  layer_sizes,
  solve_hidden_size,
)
from lm_zoo.models.heads import Dual, MixtureHead, Softmax, TiedSoftmax
from lm_zoo.models.init_schemes import INIT_SCHEMES
from lm_zoo.models.language_model import Embedding, RecurrentLM, symmetric_uniform
from lm_zoo.models.recurrent import RecurrentLayer
from lm_zoo.models.registry import CELLS, HEADS, HeadSpec, register_cell, register_head
from lm_zoo.models.stacks import LSTMRHN, Stack

__all__ = [
  'CELLS',
  'HEADS',
  'INIT_SCHEMES',
  'HeadSpec',
  'LSTMRHN',
  'Dual',
  'Embedding',
  'MixtureHead',
  'RecurrentLM',
  'RecurrentLayer',
  'Softmax',
  'Stack',
  'TiedSoftmax',
  'build_model',
  'check_model_config',
  'count_params',
  'describe_model',
  'init_params',
  'layer_sizes',
  'register_cell',
  'register_head',
  'solve_hidden_size',
  'symmetric_uniform',
]
