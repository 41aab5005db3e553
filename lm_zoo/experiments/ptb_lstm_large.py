"""Zaremba et al. (2014) PTB "large": 2 x 1500 LSTM, dropout 0.65, 55 epochs.

Paper: valid 82.2, test 78.4. The recipe is `lm_zoo.experiments.recipes.zaremba_config`.
"""

from lm_zoo.experiments.recipes import zaremba_config


def get_config(variant: str = 'code'):
  """'code' (default): the learning-rate schedule and the two gate biases of
  the authors' code; 'paper' (`--config=experiments/ptb_lstm_large.py:paper`):
  the paper's text (`zaremba_config`)."""
  return zaremba_config('large', variant or 'code')
