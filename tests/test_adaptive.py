"""AdaptiveDense and its policy networks against eq. (2)-(4) in NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturb
from jax.test_util import check_grads
from numpy_reference import adaptive_dense, dense, sigmoid

from lm_zoo.errors import ConfigError
from lm_zoo.layers import AdaptiveDense, FeedForwardPolicy, GLUPolicy, LinearPolicy, policy_slots

M, N, B = 4, 5, 3


def _x(seed=0, shape=(B, M)):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize(
  'policy,inner',
  [('input', ()), ('output', ()), ('io', ()), ('sva', (2,)), (3, (6,)), ((True, False, True), ())],
)
def test_policies_match_equations(policy, inner):
  layer = AdaptiveDense(N, policy, inner_features=inner)
  x, cond = _x(0), _x(1, (B, 3))
  params = perturb(layer.init(jax.random.key(0), x, cond)['params'])
  y = layer.apply({'params': params}, x, cond)
  # The policies: LinearPolicy's U v + 1 (perturbed), cut per adapting slot.
  flat = dense(params['policy']['Dense_0'], cond)
  slots = policy_slots(policy)
  sizes = [M, *(inner or [N] * (len(slots) - 2)), N]
  slot_policies, start = [], 0
  for size, adapts in zip(sizes, slots):
    slot_policies.append(flat[:, start : start + size] if adapts else None)
    start += size if adapts else 0
  bias_policy = flat[:, start:]
  assert bias_policy.shape == (B, N)
  kernels = [params[f'kernel_{j}'] for j in range(1, len(slots))]
  expected = adaptive_dense(kernels, params['bias'], x, slot_policies, bias_policy)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('policy,inner', [('io', ()), ('sva', (3,)), ('input', ())])
def test_unit_policies_give_the_static_layer(policy, inner):
  layer = AdaptiveDense(N, policy, inner_features=inner)
  x = _x()
  params = perturb(layer.init(jax.random.key(0), x)['params'])
  kernels = [np.asarray(params[k]) for k in sorted(params) if k.startswith('kernel_')]
  static = x
  for kernel in kernels:
    static = static @ kernel
  static = static + np.asarray(params['bias'])
  ones = [jnp.ones((B, n)) for n in layer.policy_sizes(M)]
  np.testing.assert_allclose(
    layer.apply({'params': params}, x, policies=ones), static, rtol=1e-5, atol=1e-5
  )
  # A fresh LinearPolicy is the unit policy: the new layer is its static layer.
  fresh = layer.init(jax.random.key(1), x)['params']
  fresh_static = x
  for k in sorted(k for k in fresh if k.startswith('kernel_')):
    fresh_static = fresh_static @ np.asarray(fresh[k])
  np.testing.assert_allclose(layer.apply({'params': fresh}, x), fresh_static, rtol=1e-5, atol=1e-5)


def test_sva_kernels_start_semi_orthogonal():
  layer = AdaptiveDense(3, 'sva', inner_features=(2,))
  params = layer.init(jax.random.key(0), _x(shape=(1, 6)))['params']
  w1, w2 = np.asarray(params['kernel_1']), np.asarray(params['kernel_2'])  # (6,2), (2,3)
  np.testing.assert_allclose(w1.T @ w1, np.eye(2), atol=1e-5)
  np.testing.assert_allclose(w2 @ w2.T, np.eye(2), atol=1e-5)


def test_policy_networks_match_equations():
  v = _x()
  glu = GLUPolicy(6)
  p = perturb(glu.init(jax.random.key(0), v)['params'])
  a, g = np.split(dense(p['Dense_0'], v), 2, axis=-1)
  np.testing.assert_allclose(glu.apply({'params': p}, v), a * sigmoid(g), rtol=1e-5, atol=1e-6)
  ff = FeedForwardPolicy(6, hidden=8)
  p = perturb(ff.init(jax.random.key(0), v)['params'])
  expected = dense(p['out'], np.maximum(dense(p['hidden'], v), 0))
  np.testing.assert_allclose(ff.apply({'params': p}, v), expected, rtol=1e-5, atol=1e-5)
  fresh = LinearPolicy(6).init(jax.random.key(0), v)
  np.testing.assert_array_equal(LinearPolicy(6).apply(fresh, v), np.ones((B, 6)))


def test_gradients_match_finite_differences():
  layer = AdaptiveDense(3, 'sva', inner_features=(2,), policy_net=GLUPolicy)
  x = _x()
  params = perturb(layer.init(jax.random.key(0), x)['params'])
  with jax.enable_x64(True):
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params)
    loss = lambda params, x: jnp.sum(jnp.tanh(layer.apply({'params': params}, x)) ** 2)
    check_grads(
      loss,
      (params, jnp.asarray(x, jnp.float64)),
      order=1,
      modes=('rev',),
      eps=1e-6,
      atol=1e-7,
      rtol=1e-6,
    )


def test_bad_policies_are_named():
  x = _x()
  with pytest.raises(ConfigError, match="unknown adaptation policy 'diag'"):
    AdaptiveDense(N, 'diag').init(jax.random.key(0), x)
  with pytest.raises(ConfigError, match='inner_features needs 1 sizes'):
    AdaptiveDense(N, 'sva', inner_features=(2, 3)).init(jax.random.key(0), x)
  with pytest.raises(ConfigError, match='takes policies of sizes'):
    AdaptiveDense(N, 'io').init(jax.random.key(0), x, policies=[jnp.ones((B, 2))])
  with pytest.raises(ConfigError, match='q >= 2'):
    policy_slots(1)
