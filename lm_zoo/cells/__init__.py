"""Recurrent cells: every one an `nn.RNNCellBase`."""

from lm_zoo.cells.base import carry_output, replace_carry_output, supports_hoisting
from lm_zoo.cells.lstm import LSTMCell

__all__ = ['LSTMCell', 'carry_output', 'replace_carry_output', 'supports_hoisting']
