"""Zaremba, Sutskever & Vinyals (2014), PTB "small": 2 x 200 LSTM, no dropout.

SGD lr 1 for 4 epochs then halved each epoch, 13 epochs, batch 20, BPTT 20,
gradient norm clipped at 5 (on the loss summed over time, averaged over the
batch), every parameter U(±0.1). Paper: valid 120.7, test 114.5.
"""

from lm_zoo.configs import base_config


def get_config():
  c = base_config()
  c.data.name = 'ptb'
  c.data.batch_size = 20
  c.data.bptt = 20
  c.model.num_layers = 2
  c.model.embed_size = 200
  c.model.hidden_size = 200
  c.model.init_scale = 0.1
  c.optimizer.name = 'sgd'
  c.optimizer.learning_rate = 1.0
  c.optimizer.clip_norm = 5.0
  c.optimizer.loss_reduction = 'sum_over_time'
  c.schedule.kind = 'exponential'
  c.schedule.factor = 0.5
  c.schedule.decay_after = 4
  c.train.num_epochs = 13
  c.train.log_every = 500
  c.train.checkpoint_every = 2000
  return c
