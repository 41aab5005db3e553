"""FeedForward: a plain MLP against NumPy, adaptive layers where asked."""

import jax
import numpy as np
import pytest
from conftest import perturb
from numpy_reference import dense

from lm_zoo.models.feedforward import FeedForward


def test_plain_layers_are_an_mlp():
  model = FeedForward((6, 5, 2))
  x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
  params = perturb(model.init(jax.random.key(0), x)['params'])
  h = np.maximum(dense(params['layer_0'], x), 0)
  h = np.maximum(dense(params['layer_1'], h), 0)
  np.testing.assert_allclose(
    model.apply({'params': params}, x), dense(params['layer_2'], h), rtol=1e-5, atol=1e-5
  )


def test_adaptive_layers_where_asked():
  model = FeedForward((6, 2), adaptive=(True, False), policy='sva', inner_features=3)
  params = model.init(jax.random.key(0), np.zeros((1, 4), np.float32))['params']
  assert set(params['layer_0']) == {'kernel_1', 'kernel_2', 'bias', 'policy'}
  assert params['layer_0']['kernel_1'].shape == (4, 3)
  assert set(params['layer_1']) == {'kernel', 'bias'}
  with pytest.raises(ValueError, match='2 flags for 3 layers'):
    FeedForward((6, 5, 2), adaptive=(True, False)).init(jax.random.key(0), np.zeros((1, 4)))
