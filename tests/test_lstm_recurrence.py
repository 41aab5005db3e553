"""lstm_recurrence: its custom VJP against autodiff of the plain scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.cells.lstm import lstm_update
from lm_zoo.cells.lstm_recurrence import lstm_recurrence


def reference(projected, kernel, c0, h0, mask):
  """The same recurrence as a plain scan, differentiated by autodiff."""
  def step(carry, p):
    c, h = carry
    new_c, new_h = lstm_update(p + (h * mask) @ kernel, c)
    return (new_c, new_h), new_h
  return jax.lax.scan(step, (c0, h0), projected)


def inputs(dtype=jnp.float64, batch=3, n=4, steps=6, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  projected = jax.random.normal(keys[0], (steps, batch, 4 * n), dtype)
  kernel = 0.5 * jax.random.normal(keys[1], (n, 4 * n), dtype)
  c0 = jax.random.normal(keys[2], (batch, n), dtype)
  h0 = jnp.tanh(jax.random.normal(keys[3], (batch, n), dtype))
  mask = jax.random.bernoulli(keys[4], 0.7, (batch, n)).astype(dtype) / 0.7
  return projected, kernel, c0, h0, mask


def objective(recurrence):
  """A scalar that reads every output and the final carry, with distinct weights."""
  def loss(projected, kernel, c0, h0, mask):
    (c, h), hs = recurrence(projected, kernel, c0, h0, mask)
    weights = jnp.arange(1, hs.size + 1, dtype=hs.dtype).reshape(hs.shape) / hs.size
    return jnp.sum(jnp.sin(hs) * weights) + jnp.sum(c ** 2) + jnp.sum(h * 0.3)
  return loss


def fused(projected, kernel, c0, h0, mask, unroll=1):
  return lstm_recurrence(projected, kernel, (c0, h0), mask, unroll=unroll)


@pytest.mark.parametrize('unroll', [1, 4])
def test_outputs_equal_the_plain_scan(unroll):
  with jax.enable_x64():
    args = inputs()
    (c, h), hs = fused(*args, unroll=unroll)
    (c_ref, h_ref), hs_ref = reference(*args)
    np.testing.assert_allclose(hs, hs_ref, rtol=1e-12)
    np.testing.assert_allclose(c, c_ref, rtol=1e-12)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12)


@pytest.mark.parametrize('unroll', [1, 3])
def test_custom_vjp_equals_autodiff_for_every_input(unroll):
  with jax.enable_x64():
    args = inputs()
    grads = jax.grad(objective(lambda *a: fused(*a, unroll=unroll)), argnums=range(5))(*args)
    expected = jax.grad(objective(reference), argnums=range(5))(*args)
    for name, got, want in zip(['projected', 'kernel', 'c0', 'h0', 'mask'], grads, expected):
      np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_custom_vjp_matches_finite_differences_of_the_kernel():
  with jax.enable_x64():
    projected, kernel, c0, h0, mask = inputs(seed=3)
    loss = objective(fused)
    grad = jax.grad(loss, argnums=1)(projected, kernel, c0, h0, mask)
    direction = jax.random.normal(jax.random.key(9), kernel.shape, kernel.dtype)
    eps = 1e-6
    numeric = (loss(projected, kernel + eps * direction, c0, h0, mask)
               - loss(projected, kernel - eps * direction, c0, h0, mask)) / (2 * eps)
    np.testing.assert_allclose(jnp.vdot(grad, direction), numeric, rtol=1e-7)


def test_float32_gradients_match_autodiff_and_no_mask_means_ones():
  projected, kernel, c0, h0, _ = inputs(jnp.float32, batch=5, n=8, steps=12)
  ones = jnp.ones_like(h0)
  got = jax.grad(objective(lambda p, k, c, h, m: lstm_recurrence(p, k, (c, h))),
                 argnums=(0, 1))(projected, kernel, c0, h0, ones)
  want = jax.grad(objective(reference), argnums=(0, 1))(projected, kernel, c0, h0, ones)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_mismatched_shapes_are_named():
  projected, kernel, c0, h0, _ = inputs(jnp.float32)
  with pytest.raises(ValueError, match='do not match the recurrent kernel'):
    lstm_recurrence(projected[..., :-1], kernel, (c0, h0))
