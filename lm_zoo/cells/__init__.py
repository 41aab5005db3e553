"""Recurrent cells and cell transforms: every one an `nn.RNNCellBase`."""

from lm_zoo.cells.base import carry_output, replace_carry_output, supports_hoisting
from lm_zoo.cells.lstm import LSTMCell
from lm_zoo.cells.mlstm import MLSTMCell
from lm_zoo.cells.mogrifier import Mogrify, mogrified

__all__ = ['LSTMCell', 'MLSTMCell', 'Mogrify', 'carry_output', 'replace_carry_output',
           'mogrified', 'supports_hoisting']
