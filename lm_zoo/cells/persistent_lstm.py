"""The LSTM recurrence over a window with both passes as persistent Mosaic GPU
kernels (Hopper), differentiable: `lstm_recurrence` with ``dtype=jnp.bfloat16``
(its products' operands bfloat16, summed in float32), one launch a window
each way.

Forward, `persistent_lstm_forward` (lm_zoo.kernels.persistent_lstm) runs

    [i, f, j, o] = P_t + h_{t-1} U
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),   h_t = σ(o) ⊙ tanh(c_t)

and keeps the activations and c_t of every step. Backward, XLA computes
every step's factors at once (`backward_factors`: σ(f), dc/dh, the gates'
scales), `persistent_lstm_backward` (lm_zoo.kernels.persistent_lstm_backward)
chains

    d_c = d_c + d_h ⊙ dc/dh_t,   d_h = dL/dh_t + dG_{t+1} Uᵀ
    dG_t = scales_t ⊙ [d_c, d_c, d_c, d_h],   d_c = d_c ⊙ σ(f_t)

in reverse, and XLA then takes dU = H_prevᵀ dG as one (n, T·B) x (T·B, 4n)
product, as `lstm_recurrence` does; dL/dP = dG, dL/dc_0 and dL/dh_0 = dG_0 Uᵀ
come with it. No state mask and no held steps (`steps`): the windows that
need them keep `lstm_recurrence`.

Example::

  (c_T, h_T), hs = persistent_lstm_recurrence(projected, kernel, (c0, h0))
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.lstm_recurrence import backward_factors, shifted
from lm_zoo.kernels.persistent_lstm import persistent_lstm_forward
from lm_zoo.kernels.persistent_lstm_backward import persistent_lstm_backward
from lm_zoo.layers.products import contract


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _recurrence(projected, recurrent_kernel, c0, h0, cap_input_gate, blocks, mode, interpret):
  carry, hs = persistent_lstm_forward(
    projected,
    recurrent_kernel,
    h0,
    c0,
    cap_input_gate=cap_input_gate,
    blocks=blocks,
    mode=mode,
    interpret=interpret,
  )
  return carry, hs


def _recurrence_fwd(projected, recurrent_kernel, c0, h0, cap_input_gate, blocks, mode, interpret):
  carry, hs, (acts, cs) = persistent_lstm_forward(
    projected,
    recurrent_kernel,
    h0,
    c0,
    cap_input_gate=cap_input_gate,
    blocks=blocks,
    mode=mode,
    interpret=interpret,
    residuals=True,
  )
  return (carry, hs), (recurrent_kernel, c0, h0, hs, acts, cs)


def _recurrence_bwd(cap_input_gate, blocks, mode, interpret, saved, cotangents):
  recurrent_kernel, c0, h0, hs, acts, cs = saved
  (d_c_last, d_h_last), d_hs = cotangents
  forget, d_c_from_h, gate_scales = backward_factors(acts, cs, c0, cap_input_gate)
  d_gates, d_c0, d_h0 = persistent_lstm_backward(
    d_hs,
    gate_scales,
    forget,
    d_c_from_h,
    recurrent_kernel,
    d_c_last,
    d_h_last,
    blocks=blocks,
    mode=mode,
    interpret=interpret,
  )
  n = h0.shape[-1]
  # The whole window's recurrent weight gradient in one matrix product.
  h_prev = shifted(h0, hs).reshape(-1, n)
  d_kernel = contract('mn,mk->nk', h_prev, d_gates.reshape(-1, 4 * n), jnp.bfloat16)
  return d_gates, d_kernel, d_c0, d_h0


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def persistent_lstm_recurrence(
  projected: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  cap_input_gate: bool = False,
  *,
  blocks: int | None = None,
  mode: str = 'persistent',
  interpret: Any = None,
):
  """The LSTM over a window, forward and backward as persistent kernels.

  Args:
    projected: W x_t + b for every step, (T, B, 4n), gate order i, f, j, o.
    recurrent_kernel: U, (n, 4n); multiplied in bfloat16 both ways.
    carry: (c_0, h_0), each (B, n); B at most 64.
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    blocks: the grid's blocks G (None: one per 8 units of n padded to 32).
    mode: 'persistent', 'unfenced', 'per_step' or 'no_barrier' (timing only), both
      passes (`lm_zoo.kernels.persistent_lstm`).
    interpret: None compiles for the GPU; Pallas' Mosaic GPU interpreter
      params run it on any backend.

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)), float32; gradients
    flow to `projected`, `recurrent_kernel` and the carry, in their dtypes.
  """
  c0, h0 = carry
  f32 = jnp.float32
  # The kernels compute in float32: the casts carry the gradients back to each dtype.
  return _recurrence(
    projected.astype(f32),
    recurrent_kernel.astype(f32),
    c0.astype(f32),
    h0.astype(f32),
    cap_input_gate,
    blocks,
    mode,
    interpret,
  )
