"""lstm_recurrence: its custom VJP against autodiff of the plain scan of its
equations, with and without the capped input gate."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxprs import summed_sizes_in_loops

from lm_zoo.cells.lstm import lstm_update
from lm_zoo.cells.lstm_recurrence import broadcast_state_mask, lstm_recurrence
from lm_zoo.layers.products import aligned_contractions, einsum


def reference(projected, kernel, c0, h0, mask, cap=False):
  """The same recurrence as a plain scan, differentiated by autodiff."""

  def step(carry, p):
    c, h = carry
    new_c, new_h = lstm_update(p + (h * mask) @ kernel, c, cap)
    return (new_c, new_h), new_h

  return jax.lax.scan(step, (c0, h0), projected)


def capped_reference(*args):
  return reference(*args, cap=True)


def cap_binds_somewhere_but_not_everywhere(projected):
  """σ(i) > 1 - σ(f) at some gates of the first step's projections and not
  at others, so both branches of the capped gate's derivative are checked."""
  n = projected.shape[-1] // 4
  i, f = jax.nn.sigmoid(projected[..., :n]), jax.nn.sigmoid(projected[..., n : 2 * n])
  binds = np.asarray(i > 1 - f)
  return binds.any() and not binds.all()


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
    return jnp.sum(jnp.sin(hs) * weights) + jnp.sum(c**2) + jnp.sum(h * 0.3)

  return loss


# Every function of these tests is run through jax.jit: op by op, each of its
# operations (and the scan) would compile on its own.


def fused(projected, kernel, c0, h0, mask, unroll=1, cap=False):
  return lstm_recurrence(projected, kernel, (c0, h0), mask, unroll=unroll, cap_input_gate=cap)


@pytest.mark.parametrize('cap', [False, True])
@pytest.mark.parametrize('unroll', [1, 4])
def test_outputs_equal_the_plain_scan(unroll, cap):
  with jax.enable_x64():
    args = inputs()
    (c, h), hs = jax.jit(partial(fused, unroll=unroll, cap=cap))(*args)
    (c_ref, h_ref), hs_ref = jax.jit(partial(reference, cap=cap))(*args)
    np.testing.assert_allclose(hs, hs_ref, rtol=1e-12)
    np.testing.assert_allclose(c, c_ref, rtol=1e-12)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12)


@pytest.mark.parametrize('cap', [False, True])
@pytest.mark.parametrize('unroll', [1, 3])
def test_custom_vjp_equals_autodiff_for_every_input(unroll, cap):
  with jax.enable_x64():
    args = inputs()
    assert cap_binds_somewhere_but_not_everywhere(args[0])
    grads = jax.jit(
      jax.grad(objective(lambda *a: fused(*a, unroll=unroll, cap=cap)), argnums=range(5))
    )(*args)
    expected = jax.jit(
      jax.grad(objective(capped_reference if cap else reference), argnums=range(5))
    )(*args)
    for name, got, want in zip(['projected', 'kernel', 'c0', 'h0', 'mask'], grads, expected):
      np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize('cap', [False, True])
def test_custom_vjp_matches_finite_differences(cap):
  with jax.enable_x64():
    args = inputs(seed=3)
    loss = jax.jit(objective(lambda *a: fused(*a, cap=cap)))
    grads = jax.jit(jax.grad(loss, argnums=range(4)))(*args)
    for k, name in enumerate(['projected', 'kernel', 'c0', 'h0']):
      direction = np.asarray(jax.random.normal(jax.random.key(9 + k), args[k].shape, args[k].dtype))
      along = lambda eps: loss(*args[:k], np.asarray(args[k]) + eps * direction, *args[k + 1 :])
      eps = 1e-6
      np.testing.assert_allclose(
        np.vdot(grads[k], direction),
        (along(eps) - along(-eps)) / (2 * eps),
        rtol=1e-6,
        err_msg=name,
      )


def test_aligned_weights_give_the_plain_scan_with_every_gradient():
  """Weights padded to 64 rows before the loop (63 units, 252 gates): every
  product in the forward and backward loops sums over a multiple of 64, and
  values and gradients are the plain scan's."""
  # JAX caches a traced function by its identity: each trace gets a new one.
  gradient = lambda: lambda *a: jax.grad(objective(fused), argnums=range(5))(*a)
  with jax.enable_x64():
    args = inputs(n=63, batch=2, steps=4)
    assert sorted(set(summed_sizes_in_loops(jax.make_jaxpr(gradient())(*args).jaxpr))) == [63, 252]
    with aligned_contractions(64):
      jaxpr = jax.make_jaxpr(gradient())(*args).jaxpr
      (c, h), hs = jax.jit(lambda *a: fused(*a))(*args)
      grads = jax.jit(gradient())(*args)
    assert sorted(set(summed_sizes_in_loops(jaxpr))) == [64, 256]
    (c_ref, h_ref), hs_ref = jax.jit(reference)(*args)
    for got, want in ((hs, hs_ref), (c, c_ref), (h, h_ref)):
      np.testing.assert_allclose(got, want, rtol=1e-12)
    expected = jax.jit(jax.grad(objective(reference), argnums=range(5)))(*args)
    for name, got, want in zip(['projected', 'kernel', 'c0', 'h0', 'mask'], grads, expected):
      np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_float32_gradients_match_autodiff_and_no_mask_means_ones():
  projected, kernel, c0, h0, _ = inputs(jnp.float32, batch=5, n=8, steps=12)
  ones = jnp.ones_like(h0)
  got = jax.jit(
    jax.grad(objective(lambda p, k, c, h, m: lstm_recurrence(p, k, (c, h))), argnums=(0, 1))
  )(projected, kernel, c0, h0, ones)
  want = jax.jit(jax.grad(objective(reference), argnums=(0, 1)))(projected, kernel, c0, h0, ones)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('cap', [False, True])
def test_bfloat16_products_match_autodiff_of_the_same_rounded_products(cap):
  """dtype=bfloat16: the gates and states stay float32 and every product
  takes bfloat16 operands, so the hand-written backward pass equals autodiff
  of a plain scan whose products are `products.einsum` in bfloat16 (which
  round the same operands and incoming gradients), and both differ from the
  float32 gradients by bfloat16's rounding."""
  projected, kernel, c0, h0, mask = inputs(jnp.float32, batch=5, n=8, steps=12)

  def rounded_reference(projected, kernel, c0, h0, mask):
    def step(carry, p):
      c, h = carry
      new_c, new_h = lstm_update(p + einsum('bn,nk->bk', h * mask, kernel, jnp.bfloat16), c, cap)
      return (new_c, new_h), new_h

    return jax.lax.scan(step, (c0, h0), projected)

  fused = objective(
    lambda p, k, c, h, m: lstm_recurrence(p, k, (c, h), m, dtype=jnp.bfloat16, cap_input_gate=cap)
  )
  (c, h), hs = jax.eval_shape(
    partial(lstm_recurrence, dtype=jnp.bfloat16, cap_input_gate=cap),
    projected,
    kernel,
    (c0, h0),
    mask,
  )
  assert hs.dtype == c.dtype == h.dtype == jnp.float32
  got = jax.jit(jax.grad(fused, argnums=(0, 1, 2, 3, 4)))(projected, kernel, c0, h0, mask)
  want = jax.jit(jax.grad(objective(rounded_reference), argnums=(0, 1, 2, 3, 4)))(
    projected, kernel, c0, h0, mask
  )
  full = jax.jit(jax.grad(objective(lambda *a: reference(*a, cap=cap)), argnums=(0, 1, 2, 3, 4)))(
    projected, kernel, c0, h0, mask
  )
  for g, w, f in zip(got, want, full):
    assert g.dtype == jnp.float32
    # float32 sums in different orders; the capped gate's c_{t-1} - tanh(j) cancels more.
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=5e-5)
    np.testing.assert_allclose(g, f, rtol=0.1, atol=0.03)
  assert max(float(jnp.abs(g - f).max()) for g, f in zip(got, full)) > 1e-3


def test_mismatched_shapes_are_named():
  projected, kernel, c0, h0, _ = inputs(jnp.float32)
  with pytest.raises(ValueError, match='do not match the recurrent kernel'):
    lstm_recurrence(projected[..., :-1], kernel, (c0, h0))


@pytest.mark.parametrize('shape', [(3, 5), (5,), (2, 3, 8), (1, 3, 8)], ids=str)
def test_a_state_mask_that_does_not_broadcast_to_h_is_refused(shape):
  """Every window broadcasts its mask here: one of another shape failed deep
  in a scan or a Pallas kernel."""
  h0 = jnp.zeros((3, 8))
  message = rf'state_mask: its shape \({", ".join(map(str, shape))},?\) does not broadcast to '
  with pytest.raises(ValueError, match=message + r"the carry's h \(3, 8\)"):
    broadcast_state_mask(jnp.ones(shape), h0)


@pytest.mark.parametrize('shape', [(3, 8), (1, 8), (3, 1), (8,), ()], ids=str)
def test_a_state_mask_that_broadcasts_to_h_is_taken(shape):
  assert broadcast_state_mask(jnp.full(shape, 0.5), jnp.zeros((3, 8))).shape == (3, 8)
