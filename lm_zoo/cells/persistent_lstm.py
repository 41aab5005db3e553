"""The LSTM recurrence over a window with both passes as persistent Mosaic GPU
kernels (Hopper), differentiable: `lstm_recurrence` with ``dtype=jnp.bfloat16``
(its products' operands bfloat16, summed in float32), one launch a window
each way.

Forward, `persistent_lstm_forward` (lm_zoo.kernels.persistent_lstm) runs

    [i, f, j, o] = P_t + (m ⊙ h_{t-1}) U
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),   h_t = σ(o) ⊙ tanh(c_t)

(m a mask on the fed-back state, one for the window: variational dropout)
and keeps the activations and c_t of every step. Backward, XLA computes
every step's factors at once (`backward_factors`: σ(f), dc/dh, the gates'
scales), `persistent_lstm_backward` (lm_zoo.kernels.persistent_lstm_backward)
chains

    d_c = d_c + d_h ⊙ dc/dh_t,   d_h = dL/dh_t + (dG_{t+1} Uᵀ) ⊙ m
    dG_t = scales_t ⊙ [d_c, d_c, d_c, d_h],   d_c = d_c ⊙ σ(f_t)

in reverse, and XLA then takes dU = (m ⊙ H_prev)ᵀ dG as one (n, T·B) x
(T·B, 4n) product, as `lstm_recurrence` does; dL/dP = dG, dL/dc_0 and
dL/dh_0 = (dG_0 Uᵀ) ⊙ m come with it. With a mask, XLA also takes its
gradient Σ_t (dG_t Uᵀ) ⊙ h_{t-1} from one (T·B, 4n) x (4n, n) product: the
chain's products again, which the kernel does not keep (a (T, B, n) write a
window more). No held steps (`steps`): a window padded past its own steps
is refused (run `scan='fused'`).

Example::

  (c_T, h_T), hs = persistent_lstm_recurrence(
    projected, kernel, (c0, h0), mask, **where_it_runs()
  )
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.cells.lstm_recurrence import backward_factors, broadcast_state_mask, shifted
from lm_zoo.errors import is_whole_number
from lm_zoo.kernels.common import interpret_default, product
from lm_zoo.kernels.grid_barrier import check_interpret, check_mode
from lm_zoo.kernels.persistent_lstm import persistent_lstm_forward
from lm_zoo.kernels.persistent_lstm_backward import persistent_lstm_backward
from lm_zoo.layers.products import contract


def check_settings(blocks: Any, mode: str, interpret: Any) -> None:
  """Raises ValueError on a `blocks`, `mode` or `interpret` that the
  persistent kernels cannot take, before they are traced (a fractional
  grid, or `interpret=True`, failed deep in Pallas)."""
  check_mode(mode)
  if blocks is not None and (not is_whole_number(blocks) or blocks < 1):
    raise ValueError(
      f'blocks must be a whole number >= 1, or None for one block per 8 units, got {blocks!r}'
    )
  check_interpret(interpret, ': pass **where_it_runs() for this backend')


def _forward(projected, recurrent_kernel, c0, h0, state_mask, settings, residuals=False):
  """`persistent_lstm_forward` with the window's settings (cap_input_gate,
  blocks, mode, interpret)."""
  cap_input_gate, blocks, mode, interpret = settings
  return persistent_lstm_forward(
    projected,
    recurrent_kernel,
    h0,
    c0,
    state_mask=state_mask,
    cap_input_gate=cap_input_gate,
    blocks=blocks,
    mode=mode,
    interpret=interpret,
    residuals=residuals,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _recurrence(
  projected, recurrent_kernel, c0, h0, state_mask, cap_input_gate, blocks, mode, interpret
):
  settings = (cap_input_gate, blocks, mode, interpret)
  return _forward(projected, recurrent_kernel, c0, h0, state_mask, settings)


def _recurrence_fwd(
  projected, recurrent_kernel, c0, h0, state_mask, cap_input_gate, blocks, mode, interpret
):
  settings = (cap_input_gate, blocks, mode, interpret)
  carry, hs, (acts, cs) = _forward(
    projected, recurrent_kernel, c0, h0, state_mask, settings, residuals=True
  )
  return (carry, hs), (recurrent_kernel, state_mask, c0, h0, hs, acts, cs)


def _mask_gradient(d_gates, recurrent_kernel, h_prev):
  """Σ_t (dG_t Uᵀ) ⊙ h_{t-1}: every step's dG_t Uᵀ in one product."""
  steps, batch, width = d_gates.shape
  d_h_in = product(
    d_gates.reshape(-1, width), recurrent_kernel, jnp.bfloat16, None, transpose_b=True
  )
  return jnp.sum(d_h_in.reshape(steps, batch, -1) * h_prev, axis=0)


def _recurrence_bwd(cap_input_gate, blocks, mode, interpret, saved, cotangents):
  recurrent_kernel, state_mask, c0, h0, hs, acts, cs = saved
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
    state_mask=state_mask,
    blocks=blocks,
    mode=mode,
    interpret=interpret,
  )
  n = h0.shape[-1]
  h_prev = shifted(h0, hs)
  h_in = h_prev if state_mask is None else h_prev * state_mask
  # The whole window's recurrent weight gradient in one matrix product.
  d_kernel = contract('mn,mk->nk', h_in.reshape(-1, n), d_gates.reshape(-1, 4 * n), jnp.bfloat16)
  d_mask = None if state_mask is None else _mask_gradient(d_gates, recurrent_kernel, h_prev)
  return d_gates, d_kernel, d_c0, d_h0, d_mask


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def persistent_lstm_recurrence(
  projected: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  state_mask: jax.Array | None = None,
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
    state_mask: multiplies h_{t-1} before U (variational dropout on the
      state), broadcastable to (B, n); None keeps h.
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    blocks: the grid's blocks G (None: one per 8 units of n padded to 32).
    mode: 'persistent', 'per_step', or 'unfenced' and 'no_barrier' (timing
      only: they may read stale values), both passes
      (`lm_zoo.kernels.grid_barrier`).
    interpret: None compiles for the GPU; Pallas' Mosaic GPU interpreter
      params run it on any backend (`where_it_runs`).

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)), float32; gradients
    flow to `projected`, `recurrent_kernel`, the carry and `state_mask`, in
    their dtypes.
  """
  check_settings(blocks, mode, interpret)
  c0, h0 = carry
  f32 = jnp.float32
  mask = None if state_mask is None else broadcast_state_mask(state_mask, h0.astype(f32))
  # The kernels compute in float32: the casts carry the gradients back to each dtype.
  return _recurrence(
    projected.astype(f32),
    recurrent_kernel.astype(f32),
    c0.astype(f32),
    h0.astype(f32),
    mask,
    cap_input_gate,
    blocks,
    mode,
    interpret,
  )


def where_it_runs() -> dict:
  """`persistent_lstm_recurrence`'s `mode` and `interpret` here: on a GPU
  compiled, one launch a window each way ('persistent'); elsewhere in
  Pallas' Mosaic GPU interpreter a launch a step ('per_step': it has no
  semaphores), exact and slow, for tests."""
  if not interpret_default():
    return dict(mode='persistent', interpret=None)
  return dict(mode='per_step', interpret=plgpu.InterpretGPUParams())
