"""Zaremba, Sutskever & Vinyals (2014), PTB "medium": 2 x 650 LSTM, dropout 0.5.

Dropout 0.5 on the non-recurrent connections (embedding output, between
layers, before the softmax), SGD lr 1 for 6 epochs then divided by 1.2 each epoch,
39 epochs, batch 20, BPTT 35, clip 5, every parameter U(±0.05).
Paper: valid 86.2, test 82.7.
"""

from lm_zoo.configs import base_config


def get_config():
  c = base_config()
  c.data.name = 'ptb'
  c.data.batch_size = 20
  c.data.bptt = 35
  c.model.num_layers = 2
  c.model.embed_size = 650
  c.model.hidden_size = 650
  c.model.init_scale = 0.05
  c.model.dropout_input = 0.5
  c.model.dropout_hidden = 0.5
  c.model.dropout_output = 0.5
  c.optimizer.name = 'sgd'
  c.optimizer.learning_rate = 1.0
  c.optimizer.clip_norm = 5.0
  c.optimizer.loss_reduction = 'sum_over_time'
  c.schedule.kind = 'exponential'
  c.schedule.factor = 1 / 1.2
  c.schedule.decay_after = 6
  c.train.num_epochs = 39
  c.train.log_every = 500
  c.train.checkpoint_every = 2000
  return c
