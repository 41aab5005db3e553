"""Mixture of softmaxes against docs/models.md §6 written again in NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.layers import MixtureOfSoftmaxes


def _numpy_mos(p, g, embedding=None):
  """P(y) = sum_k pi_k softmax(E g_k + b)(y), in plain probability space (x64)."""
  g = np.asarray(g, np.float64)
  f64 = lambda x: np.asarray(x, np.float64)
  prior = g @ f64(p['prior']['kernel'])
  prior = np.exp(prior - prior.max(-1, keepdims=True))
  prior /= prior.sum(-1, keepdims=True)
  latent = np.tanh(g @ f64(p['latent']['kernel']) + f64(p['latent']['bias']))
  k = prior.shape[-1]
  latent = latent.reshape(*g.shape[:-1], k, -1)
  e_t = f64(p['softmax']['kernel']) if embedding is None else f64(embedding).T
  logits = latent @ e_t + f64(p['bias'])
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.log((prior[..., None] * probs).sum(-2))


@pytest.mark.parametrize('tied', [False, True])
def test_equals_the_mixture_and_sums_to_one(tied):
  rng = np.random.default_rng(0)
  g = rng.normal(size=(3, 4, 6)).astype(np.float32)
  embedding = rng.normal(size=(11, 5)).astype(np.float32) if tied else None
  head = MixtureOfSoftmaxes(vocab_size=11, num_components=3, latent_size=5)
  params = head.init(jax.random.key(0), g, embedding)['params']
  assert ('softmax' in params) != tied and set(params.get('softmax', {})) <= {'kernel'}
  # Non-zero softmax bias, so that its use is checked too.
  params = {**params, 'bias': jnp.asarray(rng.normal(size=11), jnp.float32)}
  log_p = head.apply({'params': params}, g, embedding)
  assert log_p.shape == (3, 4, 11)
  np.testing.assert_allclose(jax.nn.logsumexp(log_p, axis=-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(log_p, _numpy_mos(params, g, embedding), atol=1e-5)


def test_stable_where_probabilities_underflow():
  """Every component gives token 3 a probability near e^-300, which is 0 in
  float32: mixing exp()'s would give log 0."""
  g = np.ones((1, 2), np.float32)
  head = MixtureOfSoftmaxes(vocab_size=4, num_components=2, latent_size=2)
  params = head.init(jax.random.key(0), g)['params']
  params['prior']['kernel'] = jnp.zeros((2, 2))  # pi = (1/2, 1/2)
  params['latent']['kernel'] = jnp.zeros((2, 4))
  params['latent']['bias'] = jnp.asarray([20.0, 0, 0, 20.0])  # g_1 = (1, 0), g_2 = (0, 1)
  params['softmax']['kernel'] = jnp.asarray([[300.0, 0, 0, -300], [0, 0, 0, -300]])
  log_p = np.asarray(head.apply({'params': params}, g))[0]
  # Component 2 dominates: 1/2 * e^-300 / (3 + e^-300); component 1 adds e^-600.
  np.testing.assert_allclose(log_p[3], np.log(0.5) - 300 - np.log(3), rtol=1e-5)
  np.testing.assert_allclose(jax.nn.logsumexp(log_p), 0.0, atol=1e-5)


def test_one_component_is_a_softmax_over_the_latent():
  g = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
  head = MixtureOfSoftmaxes(vocab_size=7, num_components=1, latent_size=4)
  params = head.init(jax.random.key(2), g)['params']
  latent = jnp.tanh(g @ params['latent']['kernel'] + params['latent']['bias'])
  logits = latent @ params['softmax']['kernel'] + params['bias']
  np.testing.assert_allclose(
    head.apply({'params': params}, g), jax.nn.log_softmax(logits), atol=1e-5
  )


def test_latent_dropout_shares_masks_along_broadcast_dims_and_is_off_at_eval():
  g = np.random.default_rng(3).normal(size=(2, 6, 3)).astype(np.float32)
  head = MixtureOfSoftmaxes(
    vocab_size=5, num_components=2, latent_size=4, dropout_latent=0.5, broadcast_dims=(1,)
  )
  params = head.init(jax.random.key(0), g)['params']
  latents = np.tanh(g @ params['latent']['kernel'] + params['latent']['bias'])
  latents = latents.reshape(2, 6, 2, 4)
  is_dropout = lambda module, _: module.name == 'latent_dropout'
  for deterministic in (True, False):
    _, state = head.apply(
      {'params': params},
      g,
      deterministic=deterministic,
      rngs={'dropout': jax.random.key(1)},
      capture_intermediates=is_dropout,
      mutable=['intermediates'],
    )
    dropped = np.asarray(state['intermediates']['latent_dropout']['__call__'][0])
    if deterministic:
      np.testing.assert_allclose(dropped, latents, atol=1e-6)
      continue
    kept = dropped != 0
    assert 0 < kept.mean() < 1
    assert (kept == kept[:, :1]).all()  # one mask for every time step
    np.testing.assert_allclose(dropped[kept], 2 * latents[kept], rtol=1e-5)


def test_bad_tied_embedding_shape():
  head = MixtureOfSoftmaxes(vocab_size=5, num_components=2, latent_size=4)
  with pytest.raises(ValueError, match='tied embedding'):
    head.init(jax.random.key(0), np.ones((1, 3), np.float32), np.ones((5, 3), np.float32))
