"""Quick-start default: one epoch of Zaremba's small PTB LSTM, BPTT 35.

About five minutes of training on 2 CPU cores; valid perplexity near 190.
"""

from lm_zoo.configs import zaremba_config


def get_config():
  c = zaremba_config('small')
  c.data.bptt = 35
  c.train.num_epochs = 1
  c.train.log_every = 100
  return c
