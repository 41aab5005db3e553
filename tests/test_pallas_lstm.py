"""pallas_lstm_recurrence (its kernels interpreted on the CPU) against the
fused window it must equal, values and gradients, and as a layer's scan."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.cells import LSTMCell
from lm_zoo.cells.lstm_recurrence import lstm_recurrence
from lm_zoo.cells.pallas_lstm import pallas_lstm_recurrence
from lm_zoo.kernels.lstm_step import Tiles
from lm_zoo.models import RecurrentLayer


def _window(batch, n, steps=5, seed=0):
  keys = jax.random.split(jax.random.key(seed), 5)
  projected = jax.random.normal(keys[0], (steps, batch, 4 * n))
  kernel = 0.3 * jax.random.normal(keys[1], (n, 4 * n))
  c0 = jax.random.normal(keys[2], (batch, n))
  h0 = jnp.tanh(jax.random.normal(keys[3], (batch, n)))
  mask = jax.random.bernoulli(keys[4], 0.7, (batch, n)).astype(jnp.float32) / 0.7
  return projected, kernel, c0, h0, mask


def _loss(recurrence, **kwargs):
  """A scalar that reads every output and the final carry, with distinct weights."""

  def loss(projected, kernel, c0, h0, mask):
    (c, h), hs = recurrence(projected, kernel, (c0, h0), mask, **kwargs)
    weights = jnp.arange(1, hs.size + 1, dtype=hs.dtype).reshape(hs.shape) / hs.size
    return jnp.sum(jnp.sin(hs) * weights) + jnp.sum(c**2) + jnp.sum(h * 0.3)

  return loss


def _relative(got, want):
  return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


@pytest.mark.parametrize(
  'batch, n, cap, tiles',
  [
    (3, 20, False, None),  # both axes padded: 3 rows to 16, 20 units to 32
    (16, 32, True, Tiles(batch=16, units=16, chunk=16)),  # two unit tiles, two chunks
    (17, 16, True, None),
  ],
)  # two row tiles
def test_float32_values_and_gradients_are_the_fused_windows(batch, n, cap, tiles):
  args = _window(batch, n)
  # Both sides compiled whole: op by op, the fused window would compile each operation alone.
  want, want_grads = jax.jit(
    jax.value_and_grad(_loss(lstm_recurrence, cap_input_gate=cap), argnums=range(5))
  )(*args)
  got, got_grads = jax.jit(
    jax.value_and_grad(
      _loss(pallas_lstm_recurrence, cap_input_gate=cap, tiles=tiles), argnums=range(5)
    )
  )(*args)
  assert abs(got - want) <= 1e-5 * abs(want)
  for name, g, w in zip(('projected', 'kernel', 'c0', 'h0', 'mask'), got_grads, want_grads):
    assert _relative(g, w) < 1e-5, name


def test_bfloat16_products_agree_with_the_fused_windows_within_their_rounding():
  args = _window(4, 24, seed=1)
  kwargs = dict(dtype=jnp.bfloat16, cap_input_gate=True)
  want, want_grads = jax.jit(
    jax.value_and_grad(_loss(lstm_recurrence, **kwargs), argnums=range(5))
  )(*args)
  got, got_grads = jax.jit(
    jax.value_and_grad(_loss(pallas_lstm_recurrence, **kwargs), argnums=range(5))
  )(*args)
  assert abs(got - want) <= 1e-3 * abs(want)
  for g, w in zip(got_grads, want_grads):
    assert _relative(g, w) < 1e-2


def test_a_layer_with_scan_pallas_runs_the_kernels_and_equals_the_plain_scan():
  cell = LSTMCell(8, cap_input_gate=True, recurrent_bias=True)
  xs = jax.random.normal(jax.random.key(1), (4, 3, 5))
  carry = cell.initialize_carry(jax.random.key(2), (3, 5))
  params = RecurrentLayer(cell, scan='scan').init(jax.random.key(0), carry, xs)
  params = jax.tree.map(lambda p: p + 0.1, params)  # a nonzero second bias
  run = lambda scan: jax.jit(RecurrentLayer(cell, scan=scan).apply)(params, carry, xs)
  jaxpr = str(
    jax.make_jaxpr(lambda p: RecurrentLayer(cell, scan='pallas').apply(p, carry, xs))(params)
  )
  assert 'lstm_step_forward' in jaxpr
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), run('pallas'), run('scan')
  )


def test_shapes_that_do_not_fit_are_refused_naming_both():
  projected, kernel, c0, h0, _ = _window(3, 8)
  with pytest.raises(
    ValueError,
    match=r'projected inputs \(5, 3, 28\) and recurrent kernel '
    r'\(8, 32\) do not fit a carry of \(3, 8\)',
  ):
    pallas_lstm_recurrence(projected[..., :28], kernel, (c0, h0))


def test_a_cell_state_that_does_not_fit_the_carry_is_refused():
  """c_0 was padded to the kernels' tiles and cut back to its own shape: a
  narrower one ran, silently."""
  projected, kernel, c0, h0, _ = _window(3, 8)
  with pytest.raises(
    ValueError,
    match=r"the carry's arrays \(\(3, 5\), \(3, 8\)\) do not fit projected inputs "
    r'\(5, 3, 32\): expected \(\(3, 8\), \(3, 8\)\)',
  ):
    pallas_lstm_recurrence(projected, kernel, (c0[:, :5], h0))


def test_a_state_mask_that_does_not_broadcast_to_h_is_refused():
  projected, kernel, c0, h0, _ = _window(3, 8)
  with pytest.raises(ValueError, match=r"state_mask: its shape \(3, 5\) .* carry's h \(3, 8\)"):
    pallas_lstm_recurrence(projected, kernel, (c0, h0), jnp.ones((3, 5)))


@pytest.mark.parametrize('tiles', [(16, 16, 16), {'batch': 16}], ids=['tuple', 'dict'])
def test_tiles_that_are_not_a_tiles_are_refused(tiles):
  """The kernels read the tiling by name: a tuple failed with an AttributeError."""
  projected, kernel, c0, h0, _ = _window(3, 8)
  with pytest.raises(ValueError, match=r'tiles must be a lm_zoo.kernels.lstm_step.Tiles, .* got '):
    pallas_lstm_recurrence(projected, kernel, (c0, h0), tiles=tiles)


INTERPRET_MESSAGE = r"interpret must be True \(Pallas' interpreter\), False .* or None .*, got "


@pytest.mark.parametrize('interpret', ['no', 'False', 0, 1.0], ids=repr)
def test_an_interpret_that_is_not_a_bool_or_none_is_refused(interpret):
  """Pallas takes any truthy value as True: interpret='no' ran interpreted."""
  projected, kernel, c0, h0, _ = _window(3, 8)
  with pytest.raises(ValueError, match=INTERPRET_MESSAGE + re.escape(repr(interpret))):
    pallas_lstm_recurrence(projected, kernel, (c0, h0), interpret=interpret)
