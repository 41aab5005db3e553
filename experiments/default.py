"""Quick-start default: one epoch of a 2 x 200 LSTM on PTB (a few minutes on 2 CPU cores).

Zaremba et al.'s small model and optimiser, trained for one epoch only.
"""

from lm_zoo.configs import base_config


def get_config():
  c = base_config()
  c.data.name = 'ptb'
  c.data.batch_size = 20
  c.data.bptt = 35
  c.model.num_layers = 2
  c.model.embed_size = 200
  c.model.hidden_size = 200
  c.model.init_scale = 0.1
  c.optimizer.name = 'sgd'
  c.optimizer.learning_rate = 1.0
  c.optimizer.clip_norm = 5.0
  c.optimizer.loss_reduction = 'sum_over_time'
  c.train.num_epochs = 1
  c.train.log_every = 100
  return c
