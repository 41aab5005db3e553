"""The dual connection against its equation d_t = ReLU(W_d [e_t; h_t] + b_d)."""

import jax
import numpy as np
import pytest

from lm_zoo.layers import DualConnection


def test_equals_the_equation():
  rng = np.random.default_rng(0)
  e = rng.normal(size=(3, 5, 4)).astype(np.float32)
  h = rng.normal(size=(3, 5, 6)).astype(np.float32)
  layer = DualConnection(features=7)
  params = layer.init(jax.random.key(0), e, h)['params']
  w = np.asarray(params['dense']['kernel'], np.float64)
  b = rng.normal(size=7)
  params['dense']['bias'] = b.astype(np.float32)
  # W_d [e; h] = W_e e + W_h h: the concatenation written as two products.
  expected = np.maximum(e @ w[:4] + h @ w[4:] + b, 0.0)
  d = layer.apply({'params': params}, e, h)
  assert d.shape == (3, 5, 7)
  np.testing.assert_allclose(d, expected, atol=1e-5)
  assert (np.asarray(d) == 0).any() and (np.asarray(d) > 0).any()


def test_dropout_masks_shared_along_broadcast_dims_scaled_and_off_at_eval():
  rng = np.random.default_rng(1)
  e = rng.normal(size=(8, 3, 4)).astype(np.float32)  # time-major (T, B, .)
  h = rng.normal(size=(8, 3, 4)).astype(np.float32)
  layer = DualConnection(features=5, dropout_input=0.5, dropout_output=0.5, broadcast_dims=(0,))
  params = layer.init(jax.random.key(0), e, h)['params']
  np.testing.assert_allclose(
    layer.apply({'params': params}, e, h), DualConnection(5).apply({'params': params}, e, h)
  )
  _, state = layer.apply(
    {'params': params},
    e,
    h,
    deterministic=False,
    rngs={'dropout': jax.random.key(3)},
    capture_intermediates=True,
    mutable=['intermediates'],
  )
  inter = state['intermediates']
  dropped_in = np.asarray(inter['Dropout_0']['__call__'][0])
  x = np.concatenate([e, h], -1)
  kept = dropped_in != 0
  assert 0 < kept.mean() < 1 and (kept == kept[:1]).all()
  np.testing.assert_allclose(dropped_in[kept], 2 * x[kept], rtol=1e-6)
  dense_out = np.maximum(np.asarray(inter['dense']['__call__'][0]), 0)
  dropped_out = np.asarray(inter['Dropout_1']['__call__'][0])
  # ReLU zeros hide the mask; where d_t > 0 it must be the same at every t.
  kept = np.where(dense_out > 0, dropped_out != 0, np.nan)
  assert np.array_equal(np.nanmax(kept, 0), np.nanmin(kept, 0), equal_nan=True)
  assert 0 < np.nanmean(kept) < 1
  np.testing.assert_allclose(dropped_out, 2 * dense_out * (dropped_out != 0), rtol=1e-6)


def test_mismatched_inputs():
  with pytest.raises(ValueError, match='agree'):
    DualConnection(3).init(jax.random.key(0), np.ones((2, 4, 3)), np.ones((2, 5, 3)))
