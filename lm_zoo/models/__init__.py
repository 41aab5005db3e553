"""Language models built from any recurrent cell."""

from lm_zoo.models.factory import CELLS, build_model, init_params
from lm_zoo.models.language_model import RecurrentLM, symmetric_uniform
from lm_zoo.models.recurrent import RecurrentLayer, RecurrentStack

__all__ = ['CELLS', 'build_model', 'init_params', 'RecurrentLM', 'RecurrentLayer', 'RecurrentStack', 'symmetric_uniform']
