"""Extreme tail regression (aLSTM paper section 5.1): y = (2 x1)^2 - (3 x2)^4 + ε.

The paper's settings: a 3-layer feed-forward network with 10 hidden units
against a 2-layer network with 2 hidden units whose first layer is adaptive
(SVA, a GLU policy) and whose last is static; 10,000 Adam steps, batch 50,
learning rate 0.003.

  lm-zoo-task --config=experiments/tail_regression.py \
      --output=runs/tail_regression.json
"""

import ml_collections

from lm_zoo.tasks import feedforward_spec


def get_config():
  c = ml_collections.ConfigDict()
  c.task = 'tail_regression'
  c.models = ml_collections.ConfigDict(
    {
      'feedforward_3x10': feedforward_spec((10, 10, 1)),
      'adaptive_2x2': feedforward_spec((2, 1), (True, False)),
    }
  )
  c.steps = 10_000
  c.batch_size = 50
  c.learning_rate = 3e-3
  c.num_test = 10_000
  c.num_saved = 2_000  # test points kept in the output for the plot
  c.seed = 0  # initialisation and training batches
  c.test_seed = 1000  # the test set: the same for every training seed
  return c
