"""The Mogrifier LSTM over a window with each time step two Pallas kernels.

`pallas_mogrified_lstm_recurrence` computes what `mixed_lstm_recurrence`
does with the Mogrifier's rounds as its mix, with the same hand-written
backward pass (W's and U's gradients one product after the backward scan,
the rounds' weight gradients `MogrifierRounds.params_gradient` of every step
at once), but each step forward is two kernels: every round in one
(`lm_zoo.kernels.mogrifier_rounds`: a round needs the whole previous one, so
its programs own whole rows) and the gates' product with the cell update in
the other (`lm_zoo.kernels.lstm_step`, reading [x^↑; h^↑] through [W; U]:
its programs own tiles of units); back, the same two in reverse. The window
converts to the kernels' padded, gate-major layout once on the way in and
out; padded units have zero weights and inputs, so they change nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.held_steps import check_steps, held, output_gradients, own
from lm_zoo.cells.lstm_recurrence import broadcast_state_mask, gate_factors, shifted
from lm_zoo.cells.mixed_lstm_recurrence import check_shapes
from lm_zoo.cells.mogrifier import MogrifierRounds, round_name
from lm_zoo.cells.pallas_lstm import (
  check_carry,
  check_tiles,
  cut_to,
  gate_major,
  pad_to,
  round_up,
)
from lm_zoo.kernels.common import check_interpret
from lm_zoo.kernels.lstm_step import GATES, Tiles, backward_step, forward_step, row_tiles, tiles_for
from lm_zoo.kernels.mogrifier_rounds import rounds_backward, rounds_forward
from lm_zoo.layers.products import contract, product_dtype


def _rank_size(rank: int) -> int:
  """The padded rank: a power of two of at least 16 (the matrix units' smallest)."""
  size = 16
  while size < rank:
    size *= 2
  return size


def _gates_kernel(matrix, size_in, size_out, dtype):
  """(rows, 4n) -> (4, size_in, size_out)."""
  rows, four_n = matrix.shape
  matrix = jnp.moveaxis(matrix.reshape(rows, GATES, four_n // GATES), 1, 0)
  return pad_to(matrix.astype(dtype), (GATES, size_in, size_out))


def _padded_rounds(mix: MogrifierRounds, params, size_m, size_n, dtype):
  """Each round's parameters padded to the kernels' widths, products in `dtype`."""
  padded = []
  for i in range(1, mix.rounds + 1):
    p = params[round_name(i)]
    source, width = (size_n, size_m) if i % 2 else (size_m, size_n)
    bias = pad_to(p['bias'].astype(jnp.float32), (width,))
    if 'kernel_in' in p:
      rank = _rank_size(p['kernel_in'].shape[1])
      padded.append(
        {
          'kernel_in': pad_to(p['kernel_in'].astype(dtype), (source, rank)),
          'kernel_out': pad_to(p['kernel_out'].astype(dtype), (rank, width)),
          'bias': bias,
        }
      )
    else:
      padded.append({'kernel': pad_to(p['kernel'].astype(dtype), (source, width)), 'bias': bias})
  return padded


def _layout(inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask, dtype, tiles):
  steps, batch, m = inputs.shape
  n = h0.shape[-1]
  size_b, size_m = round_up(batch, tiles.batch), round_up(m, tiles.unit_multiple)
  size_n = round_up(n, tiles.unit_multiple)
  kernel = jnp.concatenate(
    [
      _gates_kernel(input_kernel, size_m, size_n, dtype),
      _gates_kernel(recurrent_kernel, size_n, size_n, dtype),
    ],
    axis=1,
  )
  gate_bias = gate_major(
    jnp.broadcast_to(bias.astype(jnp.float32), (batch, GATES * n)), size_b, size_n
  )
  state = lambda x: pad_to(x.astype(jnp.float32), (size_b, size_n))
  xs = pad_to(inputs.astype(jnp.float32), (steps, size_b, size_m))
  return xs, kernel, gate_bias, state(c0), state(h0), state(mask)


def _forward(
  mix,
  mix_params,
  input_kernel,
  bias,
  recurrent_kernel,
  inputs,
  c0,
  h0,
  mask,
  own_steps,
  dtype,
  unroll,
  cap_input_gate,
  tiles,
  interpret,
):
  xs, kernel, gate_bias, c, h, mask = _layout(
    inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask, dtype, tiles
  )
  rounds = _padded_rounds(mix, mix_params, xs.shape[-1], h.shape[-1], mix.dtype or jnp.float32)
  mogrify = functools.partial(
    rounds_forward,
    zigzag=mix.zigzag,
    tiles=row_tiles(tiles),
    dtype=mix.dtype or jnp.float32,
    interpret=interpret,
  )
  gates_step = functools.partial(
    forward_step, tiles=tiles, dtype=dtype, cap_input_gate=cap_input_gate, interpret=interpret
  )

  def step(carry, per_step):
    x, valid = per_step
    mixed, round_gates, hiddens = mogrify(x, carry[1] * mask, rounds)
    c, h, act = gates_step(mixed, None, carry[0], gate_bias, kernel)
    return held(valid, (c, h), carry), (own(valid, h), act, c, mixed, round_gates, hiddens)

  (c, h), saved = jax.lax.scan(step, (c, h), (xs, own_steps), unroll=unroll)
  return (c, h), saved, (xs, kernel, mask, rounds)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 10, 11, 12, 13, 14))
def _recurrence(
  mix,
  mix_params,
  input_kernel,
  bias,
  recurrent_kernel,
  inputs,
  c0,
  h0,
  mask,
  own_steps,
  dtype,
  unroll,
  cap_input_gate,
  tiles,
  interpret,
):
  (c, h), (hs, *_), _ = _forward(
    mix,
    mix_params,
    input_kernel,
    bias,
    recurrent_kernel,
    inputs,
    c0,
    h0,
    mask,
    own_steps,
    dtype,
    unroll,
    cap_input_gate,
    tiles,
    interpret,
  )
  return cut_to(hs, h0), (cut_to(c, c0), cut_to(h, h0))


def _recurrence_fwd(
  mix,
  mix_params,
  input_kernel,
  bias,
  recurrent_kernel,
  inputs,
  c0,
  h0,
  mask,
  own_steps,
  dtype,
  unroll,
  cap_input_gate,
  tiles,
  interpret,
):
  (c, h), saved, padded = _forward(
    mix,
    mix_params,
    input_kernel,
    bias,
    recurrent_kernel,
    inputs,
    c0,
    h0,
    mask,
    own_steps,
    dtype,
    unroll,
    cap_input_gate,
    tiles,
    interpret,
  )
  originals = (mix_params, input_kernel, bias, recurrent_kernel, inputs, c0, h0, mask, own_steps)
  return (cut_to(saved[0], h0), (cut_to(c, c0), cut_to(h, h0))), (originals, saved, padded)


def _lstm_weight_gradients(mixed, d_gates, m, n, size_m, dtype):
  """dL/d(W, b, U) in float32 from every step's padded [x^↑; h^↑] and gate
  gradients (gate-major), W's and U's in one matrix product for the window."""
  size_n = d_gates.shape[-1]
  d_gate_rows = jnp.moveaxis(d_gates, 1, 2).reshape(-1, GATES * size_n)
  d_kernel = contract('tk,tj->kj', mixed.reshape(-1, mixed.shape[-1]), d_gate_rows, dtype)
  d_kernel = d_kernel.reshape(-1, GATES, size_n)[:, :, :n]
  return (
    d_kernel[:m].reshape(m, GATES * n),
    jnp.sum(d_gates, axis=(0, 2))[:, :n].reshape(GATES * n),
    d_kernel[size_m : size_m + n].reshape(n, GATES * n),
  )


def _rounds_gradient(mix, mix_params, inputs, n, h_in, saved, gradients):
  """`mix.params_gradient` from every step's sources x and h_in, the rounds'
  gates and low-rank hiddens (`saved`) and their gradients (`gradients`): all
  in the kernels' padded layout, each cut here to the batch and its width (h_in
  to n)."""
  _, batch, m = inputs.shape
  ranks = [p['kernel_in'].shape[1] for p in mix_params.values() if 'kernel_in' in p]
  widths = [m if i % 2 else n for i in range(1, mix.rounds + 1)]
  cut = lambda a, width: a[:, :batch, :width]
  per_round = lambda gates, hiddens: jnp.concatenate(
    [cut(g, w) for g, w in zip(gates, widths)] + [cut(g, r) for g, r in zip(hiddens, ranks)],
    axis=-1,
  )
  return mix.params_gradient(
    mix_params,
    inputs.astype(jnp.float32),
    cut(h_in, n),
    per_round(*saved),
    per_round(*gradients),
  )


def _recurrence_bwd(mix, dtype, unroll, cap_input_gate, tiles, interpret, residuals, cotangents):
  originals, (hs, acts, cs, mixed, round_gates, hiddens), padded = residuals
  mix_params, input_kernel, bias, recurrent_kernel, inputs, c0, h0, mask, own_steps = originals
  xs, kernel, padded_mask, rounds = padded
  d_hs, (d_c_last, d_h_last) = cotangents
  (steps, batch, m), n = inputs.shape, h0.shape[-1]
  size_b, size_n = hs.shape[1:]
  pad_state = lambda x: pad_to(x.astype(jnp.float32), (size_b, size_n))
  forget, d_c_from_h, scales = gate_factors(
    *(acts[:, g] for g in range(GATES)), cs, pad_state(c0), cap_input_gate
  )
  scales = jnp.stack(scales, axis=1)
  # The final h is the last own step's: its gradient joins that step's output's.
  d_out = output_gradients(
    pad_to(d_hs.astype(jnp.float32), (steps, size_b, size_n)), own_steps, pad_state(d_h_last)
  )
  h_prev = shifted(pad_state(h0), hs)
  unmogrify = functools.partial(
    rounds_backward,
    zigzag=mix.zigzag,
    tiles=row_tiles(tiles),
    dtype=mix.dtype or jnp.float32,
    interpret=interpret,
  )
  gates_back = functools.partial(backward_step, tiles=tiles, dtype=dtype, interpret=interpret)

  def step(carry, per_step):
    d_out_t, d_c_from_h_t, scales_t, forget_t, x_t, h_t, round_gates_t, valid = per_step
    d_c, d_mixed, d_gates = gates_back(
      d_out_t, carry[1], padded_mask, carry[0], d_c_from_h_t, scales_t, forget_t, kernel
    )
    d_x, d_rec, d_z, d_hidden = unmogrify(d_mixed, x_t, h_t * padded_mask, round_gates_t, rounds)
    return held(valid, (d_c, d_rec), carry), own(valid, (d_gates, d_x, d_rec, d_z, d_hidden))

  (d_c0, d_rec0), (d_gates, d_xs, d_recs, d_zs, d_hiddens) = jax.lax.scan(
    step,
    (pad_state(d_c_last), jnp.zeros((size_b, size_n), jnp.float32)),
    (d_out, d_c_from_h, scales, forget, xs, h_prev, round_gates, own_steps),
    reverse=True,
    unroll=unroll,
  )
  d_input_kernel, d_bias, d_recurrent_kernel = _lstm_weight_gradients(
    mixed, d_gates, m, n, xs.shape[-1], dtype
  )
  d_mix_params = _rounds_gradient(
    mix, mix_params, inputs, n, h_prev * padded_mask, (round_gates, hiddens), (d_zs, d_hiddens)
  )
  return (
    d_mix_params,
    d_input_kernel.astype(input_kernel.dtype),
    d_bias.astype(bias.dtype),
    d_recurrent_kernel.astype(recurrent_kernel.dtype),
    d_xs[:, :batch, :m].astype(inputs.dtype),
    cut_to(d_c0, c0),
    cut_to(d_rec0 * padded_mask, h0),
    cut_to(jnp.sum(d_recs * h_prev, axis=0), mask),
    None,
  )


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def _check_window(inputs, weights, carry, mix: MogrifierRounds, mix_params) -> None:
  """Raises ValueError unless the inputs, weights, carry and rounds fit one
  layer: the kernels pad every array to their tiles, so a misfit would run."""
  n = carry[-1].shape[-1]
  check_shapes(inputs, *weights, n)
  check_carry(carry, [(inputs.shape[1], n)] * 2, f'inputs {inputs.shape} and {n} units')
  mix.check_params(mix_params)
  if any('bias' not in p for p in mix_params.values()):
    raise ValueError(
      "scan='pallas' runs Mogrifier rounds with biases (LowRankDense's "
      'default): give every round its bias, or choose another scan'
    )


def pallas_mogrified_lstm_recurrence(
  inputs: jax.Array,
  input_kernel: jax.Array,
  bias: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  mix: MogrifierRounds,
  mix_params: Any,
  state_mask: jax.Array | None = None,
  dtype: Any = None,
  unroll: int = 1,
  cap_input_gate: bool = False,
  tiles: Tiles | None = None,
  interpret: bool | None = None,
  steps: jax.Array | None = None,
):
  """`mixed_lstm_recurrence` with the Mogrifier's rounds as the mix, each
  step two Pallas kernels forward and two back.

  Args:
    inputs, input_kernel, bias, recurrent_kernel, carry, state_mask, dtype,
      unroll, cap_input_gate, steps: as `mixed_lstm_recurrence`'s.
    mix: the rounds (`MogrifierRounds`); its dtype is the rounds' products'.
    mix_params: `Mogrify`'s round parameters, {'q1': ..., 'r2': ...}, each
      with a bias.
    tiles: the kernels' tiling (default `tiles_for` the batch and hidden size).
    interpret: run the kernels in Pallas' interpreter (default: off a GPU).

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)).
  """
  check_interpret(interpret)
  check_tiles(tiles)
  c0, h0 = carry
  _check_window(inputs, (input_kernel, bias, recurrent_kernel), carry, mix, mix_params)
  mask = broadcast_state_mask(state_mask, h0)
  dtype = product_dtype(dtype, inputs.dtype)
  tiles = tiles or tiles_for(h0.shape[0], max(h0.shape[-1], inputs.shape[-1]))
  hs, new_carry = _recurrence(
    mix,
    mix_params,
    input_kernel,
    bias,
    recurrent_kernel,
    inputs,
    c0,
    h0,
    mask,
    check_steps(steps, inputs.shape[0]),
    dtype,
    unroll,
    cap_input_gate,
    tiles,
    interpret,
  )
  return new_carry, hs
