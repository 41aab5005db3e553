"""The LSTM recurrence over a window with each time step one Pallas kernel.

`pallas_lstm_recurrence` computes what `lstm_recurrence` does, with the same
hand-written backward pass (the weight gradient one product after the
backward scan), but each step forward and back is one kernel of
`lm_zoo.kernels.lstm_step`: the recurrent product, the gates and the cell
update fused. The window converts to the kernels' gate-major, tile-padded
layout once, on the way in and out: padded units have zero weights and
states, so they stay at c = h = 0 and change nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.held_steps import check_steps, held, output_gradients, own
from lm_zoo.cells.lstm_recurrence import broadcast_state_mask, gate_factors, shifted
from lm_zoo.kernels.common import check_interpret
from lm_zoo.kernels.lstm_step import GATES, Tiles, backward_step, forward_step, tiles_for
from lm_zoo.layers.products import accumulation_dtype, contract, product_dtype


def round_up(size: int, multiple: int) -> int:
  return -(-size // multiple) * multiple


def pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  return jnp.pad(x, [(0, want - have) for have, want in zip(x.shape, shape)])


def cut_to(x: jax.Array, like: jax.Array) -> jax.Array:
  """`x` in the kernels' padded layout cut back to `like`'s last two sizes and dtype."""
  return x[..., : like.shape[-2], : like.shape[-1]].astype(like.dtype)


def check_carry(carry, shapes, fits: str) -> None:
  """Raises ValueError unless the arrays of `carry`, in order, have `shapes`:
  the kernels pad each state to their tiles and cut it back to its own
  shape, so a state that does not fit would be padded or cut silently.
  `fits` names what it must fit, for the message."""
  got = tuple(jnp.shape(x) for x in jax.tree.leaves(carry))
  if got != tuple(shapes):
    raise ValueError(
      f"scan='pallas': the carry's arrays {got} do not fit {fits}: expected "
      f"{tuple(shapes)} (cell.initialize_carry for the inputs' batch)"
    )


def check_tiles(tiles) -> None:
  """Raises ValueError unless `tiles` is a `Tiles` or None: the kernels read
  its fields by name, so a plain tuple failed with an AttributeError."""
  if tiles is not None and not isinstance(tiles, Tiles):
    raise ValueError(
      'tiles must be a lm_zoo.kernels.lstm_step.Tiles, for example Tiles(batch=16, units=16, '
      f'chunk=16), or None (tiles_for the batch and width), got {tiles!r}'
    )


def gate_major(x: jax.Array, batch: int, units: int) -> jax.Array:
  """(..., B, 4n) -> (..., 4, batch, units), zero-padded."""
  *lead, b, four_n = x.shape
  x = jnp.moveaxis(x.reshape(*lead, b, GATES, four_n // GATES), -2, -3)
  return pad_to(x, (*lead, GATES, batch, units))


def gate_minor(x: jax.Array, batch: int, units: int) -> jax.Array:
  """(..., 4, B', n') -> (..., batch, 4 units), the padding cut off."""
  x = jnp.moveaxis(x[..., :batch, :units], -3, -2)
  return x.reshape(*x.shape[:-2], GATES * units)


def _layout(projected, recurrent_kernel, c0, h0, mask, dtype, tiles):
  """Everything in the kernels' padded, gate-major layout."""
  batch, n = h0.shape
  size_b = round_up(batch, tiles.batch)
  size_n = round_up(n, tiles.unit_multiple)
  kernel = jnp.moveaxis(recurrent_kernel.reshape(n, GATES, n), 1, 0)
  kernel = pad_to(kernel.astype(dtype), (GATES, size_n, size_n))
  state = lambda x: pad_to(x.astype(jnp.float32), (size_b, size_n))
  return (
    gate_major(projected.astype(jnp.float32), size_b, size_n),
    kernel,
    state(c0),
    state(h0),
    state(mask),
  )


def _forward(
  projected, recurrent_kernel, c0, h0, mask, steps, dtype, cap_input_gate, tiles, interpret, unroll
):
  gates_in, kernel, c, h, mask = _layout(projected, recurrent_kernel, c0, h0, mask, dtype, tiles)
  step_kernel = functools.partial(
    forward_step, tiles=tiles, dtype=dtype, cap_input_gate=cap_input_gate, interpret=interpret
  )

  def step(carry, xs):
    p, valid = xs
    c, h, act = step_kernel(carry[1], mask, carry[0], p, kernel)
    return held(valid, (c, h), carry), (own(valid, h), act, c)

  (c, h), (hs, acts, cs) = jax.lax.scan(step, (c, h), (gates_in, steps), unroll=unroll)
  return (c, h), (hs, acts, cs), (kernel, mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _recurrence(
  projected, recurrent_kernel, c0, h0, mask, steps, dtype, cap_input_gate, tiles, interpret, unroll
):
  (c, h), (hs, _, _), _ = _forward(
    projected,
    recurrent_kernel,
    c0,
    h0,
    mask,
    steps,
    dtype,
    cap_input_gate,
    tiles,
    interpret,
    unroll,
  )
  return cut_to(hs, h0), (cut_to(c, c0), cut_to(h, h0))


def _recurrence_fwd(
  projected, recurrent_kernel, c0, h0, mask, steps, dtype, cap_input_gate, tiles, interpret, unroll
):
  (c, h), (hs, acts, cs), (kernel, padded_mask) = _forward(
    projected,
    recurrent_kernel,
    c0,
    h0,
    mask,
    steps,
    dtype,
    cap_input_gate,
    tiles,
    interpret,
    unroll,
  )
  saved = (projected, recurrent_kernel, c0, h0, mask, steps, kernel, padded_mask, hs, acts, cs)
  return (cut_to(hs, h0), (cut_to(c, c0), cut_to(h, h0))), saved


def _recurrence_bwd(dtype, cap_input_gate, tiles, interpret, unroll, saved, cotangents):
  projected, recurrent_kernel, c0, h0, mask, steps, kernel, padded_mask, hs, acts, cs = saved
  d_hs, (d_c_last, d_h_last) = cotangents
  batch, n = h0.shape
  size_t, size_b, size_n = hs.shape
  pad_state = lambda x: pad_to(x.astype(jnp.float32), (size_b, size_n))
  c_first = pad_state(c0)
  forget, d_c_from_h, scales = gate_factors(
    *(acts[:, g] for g in range(GATES)), cs, c_first, cap_input_gate
  )
  scales = jnp.stack(scales, axis=1)
  # The final h is the last own step's: its gradient joins that step's output's.
  d_out = output_gradients(
    pad_to(d_hs.astype(jnp.float32), (size_t, size_b, size_n)), steps, pad_state(d_h_last)
  )
  step_kernel = functools.partial(backward_step, tiles=tiles, dtype=dtype, interpret=interpret)

  def step(carry, xs):
    d_out_t, d_c_from_h_t, scales_t, forget_t, valid = xs
    d_c, d_rec, d_gates = step_kernel(
      d_out_t, carry[1], padded_mask, carry[0], d_c_from_h_t, scales_t, forget_t, kernel
    )
    return held(valid, (d_c, d_rec), carry), own(valid, (d_gates, d_rec))

  (d_c0, d_rec0), (d_gates, d_recs) = jax.lax.scan(
    step,
    (pad_state(d_c_last), jnp.zeros((size_b, size_n), jnp.float32)),
    (d_out, d_c_from_h, scales, forget, steps),
    reverse=True,
    unroll=unroll,
  )
  # d_recs[t] is dL/d(m ⊙ h_{t-1}).
  h_prev = shifted(pad_state(h0), hs)
  d_mask = jnp.sum(d_recs * h_prev, axis=0)
  # The whole window's recurrent weight gradient in one matrix product.
  h_in = (h_prev * padded_mask).reshape(-1, size_n)
  d_gates_rows = jnp.moveaxis(d_gates, 1, 2).reshape(-1, GATES * size_n)
  d_kernel = contract('mk,mj->kj', h_in, d_gates_rows, dtype).reshape(size_n, GATES, size_n)
  d_kernel = d_kernel[:n, :, :n].reshape(n, GATES * n)
  return (
    gate_minor(d_gates, batch, n).astype(projected.dtype),
    d_kernel.astype(recurrent_kernel.dtype),
    cut_to(d_c0, c0),
    cut_to(d_rec0 * padded_mask, h0),
    cut_to(d_mask, mask),
    None,
  )


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def _check_window(projected, recurrent_kernel, carry) -> None:
  """Raises ValueError unless W x + b, U and the carry (c_0, h_0) fit one another."""
  h0 = carry[-1]
  n = h0.shape[-1]
  if (
    projected.ndim != 3
    or recurrent_kernel.shape != (n, GATES * n)
    or (projected.shape[1:] != (h0.shape[0], GATES * n))
  ):
    raise ValueError(
      f'projected inputs {projected.shape} and recurrent kernel '
      f'{recurrent_kernel.shape} do not fit a carry of {h0.shape}: expected '
      f'(T, {h0.shape[0]}, {GATES * n}) and ({n}, {GATES * n})'
    )
  check_carry(carry, [h0.shape] * 2, f'projected inputs {projected.shape}')


def pallas_lstm_recurrence(
  projected: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  dtype: Any = None,
  cap_input_gate: bool = False,
  tiles: Tiles | None = None,
  interpret: bool | None = None,
  steps: jax.Array | None = None,
):
  """`lstm_recurrence` with one Pallas kernel per step, forward and back.

  Args:
    projected, recurrent_kernel, carry, state_mask, unroll, dtype,
      cap_input_gate, steps: as `lm_zoo.cells.lstm_recurrence.lstm_recurrence`'s.
    tiles: the kernels' tiling (`lm_zoo.kernels.lstm_step.Tiles`; default
      `tiles_for` the batch and hidden size).
    interpret: run the kernels in Pallas' interpreter (default: off a GPU).

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)).

  Example:
    >>> import jax.numpy as jnp
    >>> carry, hs = pallas_lstm_recurrence(jnp.zeros((5, 2, 8)), jnp.zeros((2, 8)),
    ...                                    (jnp.zeros((2, 2)), jnp.zeros((2, 2))))
    >>> hs.shape
    (5, 2, 2)
  """
  check_interpret(interpret)
  check_tiles(tiles)
  c0, h0 = carry
  n = h0.shape[-1]
  _check_window(projected, recurrent_kernel, carry)
  mask = broadcast_state_mask(state_mask, h0)
  dtype = product_dtype(dtype, projected.dtype)
  tiles = tiles or tiles_for(h0.shape[0], n)
  hs, new_carry = _recurrence(
    projected.astype(accumulation_dtype(dtype)),
    recurrent_kernel,
    c0,
    h0,
    mask,
    check_steps(steps, projected.shape[0]),
    dtype,
    cap_input_gate,
    tiles,
    interpret,
    unroll,
  )
  return new_carry, hs
