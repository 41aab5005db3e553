"""MNIST with adaptive feed-forward layers (aLSTM paper section 5.2, Table 1).

Logistic regression, a 3-layer feed-forward network, and 1- and 3-layer
networks of SVA layers, trained with plain SGD (learning rate 0.001, batch
128) as in the paper, for 20,000 steps (the paper: 50,000). Adaptive layers
use a feed-forward policy network on the layer's input.

  lm-zoo-task --config=experiments/mnist_adaptive.py \
      --output=runs/mnist_adaptive.json
"""

import ml_collections

from lm_zoo.tasks import feedforward_spec


def _model(features, adaptive=(), **kw):
  return feedforward_spec(features, adaptive, policy_net='feedforward', policy_hidden=32, **kw)


def get_config():
  c = ml_collections.ConfigDict()
  c.task = 'mnist'
  c.data_dir = ''  # holds mnist/; empty: lm-zoo-task's $LM_ZOO_DATA, else shared/data
  c.models = ml_collections.ConfigDict(
    {
      'logistic_regression': _model((10,)),
      'feedforward_3': _model((128, 64, 10)),
      'sva_1': _model((10,), (True,), inner_features=64),
      'sva_3': _model((128, 64, 10), (True, True, True), inner_features=32),
    }
  )
  c.steps = 20_000  # the paper: 50,000
  c.batch_size = 128
  c.learning_rate = 1e-3
  c.seed = 0
  return c
