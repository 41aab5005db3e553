"""scan='pallas' for the Mogrifier LSTM: the window (its kernels interpreted
on the CPU) against the fused window, values and every gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxprs import pallas_grids

from lm_zoo.cells import LSTMCell, Mogrify, resolve_scan
from lm_zoo.cells.mogrifier import MogrifierRounds
from lm_zoo.cells.pallas_mogrifier import pallas_mogrified_lstm_recurrence
from lm_zoo.models import RecurrentLayer

M, N, B, T = 6, 10, 3, 3


def _relative(got, want):
  return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


@pytest.mark.parametrize(
  'rounds, rank, zigzag, dtype',
  [(5, 2, True, None), (4, 0, False, None), (3, 3, True, jnp.bfloat16)],
  ids=['r5 low rank', 'r4 full rank no zigzag', 'r3 bfloat16'],
)
def test_values_and_every_gradient_are_the_fused_windows(rounds, rank, zigzag, dtype):
  cell = Mogrify(
    LSTMCell(N, cap_input_gate=True, recurrent_bias=True, dtype=dtype),
    rounds=rounds,
    rank=rank,
    zigzag=zigzag,
    dtype=dtype,
  )
  assert resolve_scan(cell, 'pallas') == 'pallas'
  keys = jax.random.split(jax.random.key(0), 5)
  xs = jax.random.normal(keys[0], (T, B, M))
  carry = (jax.random.normal(keys[1], (B, N)), jnp.tanh(jax.random.normal(keys[2], (B, N))))
  mask = jax.random.bernoulli(keys[3], 0.7, (B, N)).astype(jnp.float32) / 0.7
  params = RecurrentLayer(cell, scan='fused').init(keys[4], carry, xs, mask)['params']
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(keys[4], a.shape), params)

  def loss(p, scan, xs, mask):
    (c, h), out = RecurrentLayer(cell, scan=scan).apply({'params': p}, carry, xs, mask)
    weights = jnp.arange(out.size).reshape(out.shape) / out.size
    return jnp.sum(jnp.sin(out) * weights) + jnp.sum(c**2) + jnp.sum(h)

  gradient = jax.value_and_grad(loss, argnums=(0, 2, 3))
  # Both sides compiled whole: op by op, the fused window would compile each operation alone.
  gradient = jax.jit(gradient, static_argnums=1)
  want, want_grads = gradient(params, 'fused', xs, mask)
  got, got_grads = gradient(params, 'pallas', xs, mask)
  tolerance = 1e-5 if dtype is None else 1e-3  # both round the same operands to bfloat16
  assert abs(got - want) <= tolerance * abs(want)
  worst = max(jax.tree.leaves(jax.tree.map(_relative, got_grads, want_grads)))
  assert worst < tolerance
  np.testing.assert_allclose(
    jax.tree.leaves(got_grads)[0],
    jax.tree.leaves(want_grads)[0],
    rtol=10 * tolerance,
    atol=10 * tolerance,
  )


def test_the_rounds_run_16_rows_a_program():
  """A batch of 40, padded to 64, runs the rounds as 4 programs of 16 rows,
  forward and back (`row_tiles`)."""
  layer = RecurrentLayer(Mogrify(LSTMCell(N), rounds=3, rank=2), scan='pallas')
  xs, carry = jnp.ones((2, 40, M)), (jnp.zeros((40, N)), jnp.zeros((40, N)))
  params = jax.eval_shape(layer.init, jax.random.key(0), carry, xs)
  loss = lambda p: jnp.sum(layer.apply(p, carry, xs)[1])
  grids = pallas_grids(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  assert grids['mogrifier_rounds_forward'] == grids['mogrifier_rounds_backward'] == (4,)


def _three_rounds_layer():
  """W, b and U, a zero carry and the rounds' parameters of a 3-round, rank-2
  Mogrifier LSTM of N units on inputs of width M."""
  cell = Mogrify(LSTMCell(N), rounds=3, rank=2)
  carry = (jnp.zeros((B, N)), jnp.zeros((B, N)))
  params = cell.init(jax.random.key(0), carry, jnp.ones((B, M)))['params']
  inner = params['cell']
  mix_params = {name: p for name, p in params.items() if name != 'cell'}
  return (
    (inner['input']['kernel'], inner['input']['bias'], inner['recurrent_kernel']),
    carry,
    mix_params,
  )


@pytest.mark.parametrize(
  'batch, inputs, rounds, message',
  [
    (B + 1, M, 3, r"the carry's arrays \(\(4, 10\), \(4, 10\)\) do not fit inputs \(3, 3, 6\)"),
    (B, M - 1, 3, r'inputs \(3, 3, 5\), W \(6, 40\).* do not fit an LSTM of 10 units'),
    (B, M, 2, r"mix_params holds the rounds \['q1', 'q3', 'r2'\], but mix runs 2"),
  ],
  ids=['carry batch', 'inputs width', 'rounds'],
)
def test_a_window_that_does_not_fit_the_layer_is_refused(batch, inputs, rounds, message):
  """The kernels pad every array to their tiles, so each of these ran and
  returned a silently wrong window (a carry of 4 rows gave 4 rows of outputs
  for inputs of 3; narrower inputs ran on W's first rows)."""
  weights, _, mix_params = _three_rounds_layer()
  with pytest.raises(ValueError, match=message):
    pallas_mogrified_lstm_recurrence(
      jnp.ones((T, B, inputs)),
      *weights,
      (jnp.zeros((batch, N)), jnp.zeros((batch, N))),
      MogrifierRounds(rounds),
      mix_params,
    )


def test_an_interpret_that_is_not_a_bool_or_none_is_refused():
  """Pallas takes any truthy value as True: interpret='no' ran interpreted."""
  weights, carry, mix_params = _three_rounds_layer()
  with pytest.raises(ValueError, match=r"interpret must be True .* or None .*, got 'no'"):
    pallas_mogrified_lstm_recurrence(
      jnp.ones((T, B, M)), *weights, carry, MogrifierRounds(3), mix_params, interpret='no'
    )


def test_a_state_mask_that_does_not_broadcast_to_h_is_refused():
  weights, carry, mix_params = _three_rounds_layer()
  with pytest.raises(ValueError, match=r"state_mask: its shape \(3, 4\) .* carry's h \(3, 10\)"):
    pallas_mogrified_lstm_recurrence(
      jnp.ones((T, B, M)), *weights, carry, MogrifierRounds(3), mix_params, jnp.ones((B, 4))
    )


def test_tiles_that_are_not_a_tiles_are_refused():
  weights, carry, mix_params = _three_rounds_layer()
  with pytest.raises(ValueError, match=r'tiles must be a .*Tiles, .* got \(16, 16, 16\)'):
    pallas_mogrified_lstm_recurrence(
      jnp.ones((T, B, M)), *weights, carry, MogrifierRounds(3), mix_params, tiles=(16, 16, 16)
    )
