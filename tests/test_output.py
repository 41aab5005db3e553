"""OutputEmbedding: h W^T + b with W stored as (vocab, features)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.layers import OutputEmbedding


def test_logits_are_h_times_the_transposed_kernel_plus_bias():
  layer = OutputEmbedding(7)
  h = jax.random.normal(jax.random.key(0), (2, 3, 5))
  params = layer.init(jax.random.key(1), h)['params']
  assert params['kernel'].shape == (7, 5) and params['bias'].shape == (7,)
  params = {'kernel': params['kernel'], 'bias': jnp.arange(7.0)}
  expected = np.einsum('bth,vh->btv', np.asarray(h), np.asarray(params['kernel'])) + np.arange(7)
  np.testing.assert_allclose(layer.apply({'params': params}, h), expected, rtol=1e-5, atol=1e-6)


def test_initial_scale_is_lecun_over_the_features():
  """Var(W) = 1 / features, as for a Dense kernel (features, vocab)."""
  params = OutputEmbedding(4000).init(jax.random.key(0), jnp.ones((1, 50)))['params']
  assert np.var(np.asarray(params['kernel'])) == pytest.approx(1 / 50, rel=0.05)


def test_bfloat16_computes_in_bfloat16_from_float32_parameters():
  layer = OutputEmbedding(6, dtype=jnp.bfloat16)
  h = jnp.ones((2, 4))
  params = layer.init(jax.random.key(0), h)['params']
  assert params['kernel'].dtype == jnp.float32
  assert layer.apply({'params': params}, h).dtype == jnp.bfloat16
