"""Recurrent cells and cell transforms: every one an `nn.RNNCellBase`."""

from lm_zoo.cells.alstm import ALSTMCell, LSTMRHNStack, StaticLatent
from lm_zoo.cells.base import (carry_output, replace_carry_output, supports_hoisting,
                               supports_window_scan)
from lm_zoo.cells.lstm import LSTMCell
from lm_zoo.cells.mlstm import MLSTMCell
from lm_zoo.cells.mogrifier import Mogrify, mogrified

__all__ = ['ALSTMCell', 'LSTMCell', 'LSTMRHNStack', 'MLSTMCell', 'Mogrify', 'StaticLatent',
           'carry_output', 'mogrified', 'replace_carry_output', 'supports_hoisting',
           'supports_window_scan']
