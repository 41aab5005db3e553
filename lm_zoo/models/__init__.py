"""Language models built from any recurrent cell."""

from lm_zoo.models.factory import (CELLS, build_model, cell_factory, count_params,
                                   init_params, solve_hidden_size)
from lm_zoo.models.language_model import RecurrentLM, symmetric_uniform
from lm_zoo.models.recurrent import RecurrentLayer, RecurrentStack

__all__ = ['CELLS', 'build_model', 'cell_factory', 'count_params', 'init_params',
           'solve_hidden_size', 'RecurrentLM', 'RecurrentLayer', 'RecurrentStack', 'symmetric_uniform']
