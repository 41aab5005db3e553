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


def test_bfloat16_multiplies_rounded_operands_into_float32_logits():
  layer = OutputEmbedding(6, dtype=jnp.bfloat16)
  h = jax.random.normal(jax.random.key(1), (2, 3, 4))
  params = layer.init(jax.random.key(0), h)['params']
  assert params['kernel'].dtype == jnp.float32
  params = {'kernel': params['kernel'], 'bias': jnp.linspace(-1, 1, 6)}
  logits = layer.apply({'params': params}, h)
  assert logits.dtype == jnp.float32
  rounded = lambda x: np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32))
  expected = np.einsum('bth,vh->btv', rounded(h), rounded(params['kernel'])) + np.asarray(
    params['bias']
  )
  np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-6)
