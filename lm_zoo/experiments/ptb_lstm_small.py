"""Zaremba et al. (2014) PTB "small": 2 x 200 LSTM, no dropout, 13 epochs.

Paper: valid 120.7, test 114.5. The recipe is `lm_zoo.experiments.recipes.zaremba_config`.
"""

from lm_zoo.experiments.recipes import zaremba_config


def get_config(variant: str = 'code'):
  """'code' (default): the learning-rate schedule and the two gate biases of
  the authors' code; 'paper' (`--config=experiments/ptb_lstm_small.py:paper`):
  the paper's text (`zaremba_config`)."""
  return zaremba_config('small', variant or 'code')
