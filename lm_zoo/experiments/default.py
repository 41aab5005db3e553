"""Quick-start default: one epoch of Zaremba's small PTB LSTM, BPTT 35.

A few minutes on 2 CPU cores (README.md's quick start gives the time
measured); valid perplexity near 186.
"""

from lm_zoo.experiments.recipes import zaremba_config


def get_config():
  c = zaremba_config('small')
  c.data.bptt = 35
  c.train.num_epochs = 1
  c.train.log_every = 100
  # The library's LSTM, one gate bias: main.lua's second bias doubles the
  # bias's rate, which costs a first epoch at lr 1.
  c.model.recurrent_bias = False
  return c
