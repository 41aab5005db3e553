"""Zaremba et al. (2014) PTB "medium": 2 x 650 LSTM, dropout 0.5, 39 epochs.

Paper: valid 86.2, test 82.7 (WORKSPACE.md has ours). The recipe is
`lm_zoo.experiments.recipes.zaremba_config`.
"""

from lm_zoo.experiments.recipes import zaremba_config


def get_config(variant: str = 'code'):
  """'code' (default): the learning-rate schedule and the two gate biases of
  the authors' code; 'paper' (`--config=experiments/ptb_lstm_medium.py:paper`):
  the paper's text (`zaremba_config`)."""
  return zaremba_config('medium', variant or 'code')
