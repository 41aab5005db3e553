"""Recurrent cells and cell transforms: every one an `nn.RNNCellBase`."""

from lm_zoo.cells.alstm import ALSTMCell, LSTMRHNStack, StaticLatent
from lm_zoo.cells.base import carry_output, dropout_scaled, replace_carry_output
from lm_zoo.cells.lstm import LSTMCell
from lm_zoo.cells.mlstm import MLSTMCell
from lm_zoo.cells.mogrifier import Mogrify, mogrified
from lm_zoo.cells.scans import SCANS, CellScans, Scan, register_scans, resolve_scan

__all__ = [
  'ALSTMCell',
  'CellScans',
  'LSTMCell',
  'LSTMRHNStack',
  'MLSTMCell',
  'Mogrify',
  'SCANS',
  'Scan',
  'StaticLatent',
  'carry_output',
  'dropout_scaled',
  'mogrified',
  'register_scans',
  'replace_carry_output',
  'resolve_scan',
]
