"""The aLSTM over a window with each time step one Pallas kernel.

`pallas_alstm_recurrence` computes what `alstm_recurrence` does, with the
same hand-written backward pass (every weight gradient one product over the
window after the backward scan, `adapted_step.weight_gradients`), but
each step forward and back is one kernel of `lm_zoo.kernels.alstm_step`: the
adaptation model, the policy and the adapted LSTM update together. The
latent's input product x W_zx + b_z runs for the whole window before the
scan (and its gradient after it). The window converts to the kernels'
padded, gate-blocked layout once on the way in and out: padded units have
zero weights and states, so they stay at zero and change nothing.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lm_zoo.cells.adapted_step import (
  check_window,
  is_recurrent,
  latent_dense,
  policy_sizes,
  weight_gradients,
)
from lm_zoo.cells.held_steps import check_steps, held, output_gradients, own
from lm_zoo.cells.lstm_recurrence import broadcast_state_mask, gate_factors, shifted
from lm_zoo.cells.pallas_lstm import (
  check_carry,
  check_tiles,
  cut_to,
  pad_to,
  round_up,
)
from lm_zoo.kernels.alstm_step import backward_step, forward_step
from lm_zoo.kernels.common import check_interpret
from lm_zoo.kernels.lstm_step import GATES, Tiles, row_tiles, tiles_for
from lm_zoo.layers.products import contract, product_dtype


def _blocks(matrix, rows: int, width: int, count: int):
  """(r, count·w) -> (rows, count·width): each of the `count` blocks zero-padded."""
  r, total = matrix.shape
  blocked = pad_to(matrix.reshape(r, count, total // count), (rows, count, width))
  return blocked.reshape(rows, count * width)


def _unblocked(x, width: int, count: int):
  """(..., count·W) -> (..., count·width): each block's padding cut off."""
  blocked = x.reshape(*x.shape[:-1], count, x.shape[-1] // count)[..., :width]
  return blocked.reshape(*x.shape[:-1], count * width)


class _Sizes:
  """The window's widths (m, n, k, batch) and their padded ones."""

  def __init__(self, inputs, h0, params, tiles):
    self.batch, self.m, self.n = h0.shape[0], inputs.shape[-1], h0.shape[-1]
    self.recurrent = is_recurrent(params)
    self.latent_gates = GATES if self.recurrent else 1
    self.k = latent_dense(params)['kernel'].shape[1] // self.latent_gates
    pad = lambda size: round_up(size, tiles.chunk)
    self.rows, self.size_m, self.size_n, self.size_k = (
      round_up(self.batch, tiles.batch),
      pad(self.m),
      pad(self.n),
      pad(self.k),
    )

  def policy(self, pi):
    """π (..., m + 13n) <-> the kernels' padded blocks, either way."""
    parts = jnp.split(pi, list(_offsets(policy_sizes(self.m, self.n))), axis=-1)
    gated = lambda part: _blocks(part, self.size_k, self.size_n, GATES)
    return jnp.concatenate(
      [
        pad_to(parts[0], (self.size_k, self.size_m)),
        pad_to(parts[1], (self.size_k, self.size_n)),
        *map(gated, parts[2:]),
      ],
      axis=-1,
    )

  def unpadded_policy(self, pi):
    parts = jnp.split(pi, list(_offsets(policy_sizes(self.size_m, self.size_n))), axis=-1)
    return jnp.concatenate(
      [
        parts[0][..., : self.m],
        parts[1][..., : self.n],
        *(_unblocked(p, self.n, GATES) for p in parts[2:]),
      ],
      axis=-1,
    )


def _offsets(sizes):
  total, ends = 0, []
  for size in sizes[:-1]:
    total += size
    ends.append(total)
  return ends


def _weights(params, sizes: _Sizes, dtype):
  """W_zx (padded, for the product before the scan), b_z, and the kernels'
  W_zh, U_z, P, W, V, b, the products' operands in `dtype`."""
  s, dense = sizes, latent_dense(params)
  block = lambda matrix, rows, width, count: _blocks(matrix.astype(dtype), rows, width, count)
  latent_x = block(dense['kernel'][: s.m], s.size_m, s.size_k, s.latent_gates)
  latent_h = block(dense['kernel'][s.m :], s.size_n, s.size_k, s.latent_gates)
  latent_bias = _blocks(dense['bias'][None].astype(jnp.float32), 1, s.size_k, s.latent_gates)[0]
  latent_u = (
    (block(params['latent']['recurrent_kernel'], s.size_k, s.size_k, GATES),) if s.recurrent else ()
  )
  policy = s.policy(params['policy']['kernel'].astype(dtype))
  kernel = block(params['input']['kernel_1'], s.size_m, s.size_n, GATES)
  recurrent_kernel = block(params['recurrent']['kernel_1'], s.size_n, s.size_n, GATES)
  bias = _blocks(params['recurrent']['bias'][None].astype(jnp.float32), 1, s.size_n, GATES)[0]
  return latent_x, latent_bias, latent_h, latent_u, policy, kernel, recurrent_kernel, bias


def _forward(
  params, inputs, carry, mask, own_steps, dtype, unroll, cap_input_gate, tiles, interpret
):
  s = _Sizes(inputs, carry[-1], params, tiles)
  latent_x, latent_bias, latent_h, latent_u, policy, kernel, recurrent_kernel, bias = _weights(
    params, s, dtype
  )
  state = lambda x, width: pad_to(x.astype(jnp.float32), (s.rows, width))
  xs = pad_to(inputs.astype(jnp.float32), (inputs.shape[0], s.rows, s.size_m))
  latent_in = contract('tm,ml->tl', xs.reshape(-1, s.size_m), latent_x, dtype) + latent_bias
  latent_in = latent_in.reshape(*xs.shape[:2], -1)
  latent0, c0, h0 = carry
  padded_mask = state(mask, s.size_n)
  step_kernel = functools.partial(
    forward_step,
    weights=(latent_h, *latent_u, policy, kernel, recurrent_kernel, bias),
    cap_input_gate=cap_input_gate,
    tiles=row_tiles(tiles),
    dtype=dtype,
    interpret=interpret,
  )

  def step(carry, per_step):
    latent, c, h = carry
    x, latent_in_t, valid = per_step
    c, h_new, act, pi, a, r, z, *latent_saved = step_kernel(
      x, h, padded_mask, c, latent_in_t, latent
    )
    latent = (latent_saved[1], z) if s.recurrent else ()
    saved = _Saved(act, c, pi, a, r, z, latent_saved)
    return held(valid, (latent, c, h_new), carry), (own(valid, h_new), saved)

  latent0 = tuple(state(part, s.size_k) for part in latent0)
  last, (hs, saved) = jax.lax.scan(
    step,
    (latent0, state(c0, s.size_n), state(h0, s.size_n)),
    (xs, latent_in, own_steps),
    unroll=unroll,
  )
  return s, last, hs, saved, (xs, padded_mask, latent0, latent_x)


def _cut_carry(padded, carry):
  """A carry in the kernels' padded layout (or its gradient) in `carry`'s."""
  (latent, c, h), (latent0, c0, h0) = padded, carry
  return tuple(cut_to(a, b) for a, b in zip(latent, latent0)), cut_to(c, c0), cut_to(h, h0)


class _Saved(NamedTuple):
  """What the forward scan keeps of every step (T leading) for the backward:
  the gate activations, c_t, the policy π, the adapted products a and r, the
  latent z, and a recurrent latent's own (activations, c)."""

  acts: jax.Array
  cs: jax.Array
  pis: jax.Array
  a_s: jax.Array
  rs: jax.Array
  zs: jax.Array
  latent: Any


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _recurrence(
  params, inputs, carry, mask, own_steps, dtype, unroll, cap_input_gate, tiles, interpret
):
  _, last, hs, _, _ = _forward(
    params, inputs, carry, mask, own_steps, dtype, unroll, cap_input_gate, tiles, interpret
  )
  return cut_to(hs, carry[-1]), _cut_carry(last, carry)


def _recurrence_fwd(
  params, inputs, carry, mask, own_steps, dtype, unroll, cap_input_gate, tiles, interpret
):
  s, last, hs, saved, padded = _forward(
    params, inputs, carry, mask, own_steps, dtype, unroll, cap_input_gate, tiles, interpret
  )
  out = (cut_to(hs, carry[-1]), _cut_carry(last, carry))
  return out, (params, inputs, carry, mask, own_steps, hs, saved, padded)


def _backward_factors(s: _Sizes, saved: _Saved, c_first, latent0, cap_input_gate):
  """What the backward kernel reads that the incoming gradients do not
  change, for all steps at once: the gates' `gate_factors` (dc/dh, the gate
  scales, σ(f)), and a recurrent latent's likewise or a static latent's z."""
  forget, d_c_from_h, scales = gate_factors(
    *jnp.split(saved.acts, GATES, axis=-1), saved.cs, c_first, cap_input_gate
  )
  factors = (d_c_from_h, jnp.concatenate(scales, axis=-1), forget)
  if not s.recurrent:
    return factors, (saved.zs,)
  acts_z, cs_z = saved.latent
  forget_z, d_c_z_from_z, scales_z = gate_factors(
    *jnp.split(acts_z, GATES, axis=-1), cs_z, latent0[0], False
  )
  return factors, (d_c_z_from_z, jnp.concatenate(scales_z, axis=-1), forget_z)


def _weight_gradients(
  params, inputs, s: _Sizes, saved: _Saved, latent0, h_in, d_gates, q, d_latent_gates, dtype
):
  """`weight_gradients` of the window from the kernels' padded per-step
  values (`d_latent_gates` and `h_in` already in the cell's layout)."""
  pis, zs = saved.pis, saved.zs
  rows = lambda x: x[:, : s.batch]
  return weight_gradients(
    params,
    inputs,
    h_in,
    s.unpadded_policy(rows(pis)),
    rows(zs)[..., : s.k],
    _unblocked(rows(d_gates), s.n, GATES),
    s.unpadded_policy(rows(q)),
    d_latent_gates,
    shifted(latent0[1], zs)[:, : s.batch, : s.k] if s.recurrent else None,
    dtype,
  )


def _inputs_gradient(params, s: _Sizes, d_xs, d_latent_gates, dtype):
  """dL/dx from the kernels' dL/dx (unpadded rows) and, through the latent's
  input product before the scan, the latent gates' gradients."""
  steps = d_xs.shape[0]
  d_x_latent = contract(
    'tl,lm->tm',
    d_latent_gates.reshape(steps * s.batch, -1),
    latent_dense(params)['kernel'][: s.m].T,
    dtype,
  )
  return d_xs[..., : s.m] + d_x_latent.reshape(steps, s.batch, s.m)


def _recurrence_bwd(dtype, unroll, cap_input_gate, tiles, interpret, residuals, cotangents):
  params, inputs, carry, mask, own_steps, hs, saved, padded = residuals
  xs, padded_mask, latent0, latent_x = padded
  d_hs, (d_latent_last, d_c_last, d_h_last) = cotangents
  s = _Sizes(inputs, carry[-1], params, tiles)
  _, _, latent_h, latent_u, policy, kernel, recurrent_kernel, bias = _weights(params, s, dtype)
  state = lambda x, width: pad_to(x.astype(jnp.float32), (s.rows, width))
  h_first = state(carry[2], s.size_n)
  factors, latent_factors = _backward_factors(
    s, saved, state(carry[1], s.size_n), latent0, cap_input_gate
  )
  # The final h is the last own step's: its gradient joins that step's output's.
  d_out = output_gradients(
    pad_to(d_hs.astype(jnp.float32), (hs.shape[0], s.rows, s.size_n)),
    own_steps,
    state(d_h_last, s.size_n),
  )
  h_prev = shifted(h_first, hs)
  step_kernel = functools.partial(
    backward_step,
    weights=(kernel, recurrent_kernel, bias, policy, latent_h, *latent_u),
    tiles=row_tiles(tiles),
    dtype=dtype,
    interpret=interpret,
  )

  def step(carry, per_step):
    d_latent, d_c, d_rec = carry
    d_out_t, factors_t, x, h, saved_t, latent_factors_t, valid = per_step
    d_c, d_rec, d_gates, q, d_x, d_latent_gates, *d_latent = step_kernel(
      d_out_t, d_rec, padded_mask, d_c, factors_t, x, h, saved_t, (*d_latent, *latent_factors_t)
    )
    return (
      held(valid, (tuple(d_latent), d_c, d_rec), carry),
      own(valid, (d_gates, q, d_x, d_latent_gates, d_rec)),
    )

  (d_latent0, d_c0, d_rec0), (d_gates, q, d_xs, d_latent_gates, d_recs) = jax.lax.scan(
    step,
    (
      tuple(state(d, s.size_k) for d in d_latent_last),
      state(d_c_last, s.size_n),
      jnp.zeros_like(h_first),
    ),
    (d_out, factors, xs, h_prev, (saved.pis, saved.a_s, saved.rs), latent_factors, own_steps),
    reverse=True,
    unroll=unroll,
  )
  # Back in the cell's layout, every weight's gradient as one product over the window.
  rows = lambda x: x[:, : s.batch]
  d_latent_gates = _unblocked(rows(d_latent_gates), s.k, s.latent_gates)
  h_in = (rows(h_prev) * padded_mask[: s.batch])[..., : s.n]
  grads = _weight_gradients(
    params, inputs, s, saved, latent0, h_in, d_gates, q, d_latent_gates, dtype
  )
  d_inputs = _inputs_gradient(params, s, rows(d_xs), d_latent_gates, dtype)
  d_carry = _cut_carry((d_latent0, d_c0, d_rec0 * padded_mask), carry)
  d_mask = cut_to(jnp.sum(d_recs * h_prev, axis=0), mask)
  return grads, d_inputs.astype(inputs.dtype), d_carry, d_mask, None


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def _carry_shapes(inputs, params, n: int) -> list:
  """The shapes of the carry's arrays: the latent's (c_z, z) if it is
  recurrent, then c and h."""
  batch, recurrent = inputs.shape[1], is_recurrent(params)
  k = latent_dense(params)['kernel'].shape[1] // (GATES if recurrent else 1)
  return [(batch, k)] * (2 if recurrent else 0) + [(batch, n)] * 2


def pallas_alstm_recurrence(
  inputs: jax.Array,
  params: Any,
  carry: Any,
  state_mask: jax.Array | None = None,
  dtype: Any = None,
  unroll: int = 1,
  cap_input_gate: bool = False,
  tiles: Tiles | None = None,
  interpret: bool | None = None,
  steps: jax.Array | None = None,
):
  """`alstm_recurrence` with one Pallas kernel per step, forward and back.

  Args:
    inputs, params, carry, state_mask, dtype, unroll, cap_input_gate, steps: as
      `lm_zoo.cells.alstm_recurrence.alstm_recurrence`'s.
    tiles: the multiple the batch is padded to (`batch`; each program owns
      16 rows of it, `row_tiles`) and the chunk its loops step by (`chunk`;
      default `tiles_for` the batch and the widest of m, n).
    interpret: run the kernels in Pallas' interpreter (default: off a GPU).

  Returns:
    ((latent carry, c_T, h_T), outputs h_1..h_T of shape (T, B, n)).
  """
  check_interpret(interpret)
  check_tiles(tiles)
  h0 = carry[-1]
  n = h0.shape[-1]
  check_window(inputs, params, n)
  check_carry(carry, _carry_shapes(inputs, params, n), f'inputs {inputs.shape} and {n} units')
  tiles = tiles or tiles_for(h0.shape[0], max(n, inputs.shape[-1]))
  hs, new_carry = _recurrence(
    params,
    inputs,
    tuple(carry),
    broadcast_state_mask(state_mask, h0),
    check_steps(steps, inputs.shape[0]),
    product_dtype(dtype, inputs.dtype),
    unroll,
    cap_input_gate,
    tiles,
    interpret,
  )
  return new_carry, hs
