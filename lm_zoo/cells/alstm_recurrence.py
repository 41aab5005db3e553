"""The aLSTM (`ALSTMCell`, docs/models.md §3) over a whole window with a
hand-written backward pass: a scan of `adapted_step` forward and of
`adapted_step_backward` back (`lm_zoo.cells.adapted_step`, whose docstring
has the equations), after which every weight gradient is one product over
the window's T·B rows (`weight_gradients`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.adapted_step import (
  adapted_step,
  adapted_step_backward,
  check_window,
  is_recurrent,
  step_factors,
  step_weights,
  transposed_weights,
  weight_gradients,
)
from lm_zoo.cells.held_steps import check_steps, held, own
from lm_zoo.cells.lstm_recurrence import broadcast_state_mask, shifted
from lm_zoo.layers.products import contraction_alignment, product_dtype


def _forward_scan(
  params, inputs, carry, state_mask, steps, dtype, unroll, cap_input_gate, alignment
):
  """The outputs h_1..h_T, the final carry, and per step what the backward
  pass reads (`adapted_step`)."""
  weights = step_weights(params, dtype, alignment)

  def step(carry, xs):
    x, valid = xs
    latent_carry, c, h = carry
    new_carry, saved = adapted_step(
      params,
      weights,
      x,
      h * state_mask,
      c,
      latent_carry,
      dtype=dtype,
      cap_input_gate=cap_input_gate,
    )
    return held(valid, new_carry, carry), (own(valid, new_carry[-1]), *saved)

  new_carry, (hs, *saved) = jax.lax.scan(step, carry, (inputs, steps), unroll=unroll)
  return hs, new_carry, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _recurrence(params, inputs, carry, state_mask, steps, dtype, unroll, cap_input_gate, alignment):
  hs, new_carry, _ = _forward_scan(
    params, inputs, carry, state_mask, steps, dtype, unroll, cap_input_gate, alignment
  )
  return hs, new_carry


def _recurrence_fwd(
  params, inputs, carry, state_mask, steps, dtype, unroll, cap_input_gate, alignment
):
  hs, new_carry, saved = _forward_scan(
    params, inputs, carry, state_mask, steps, dtype, unroll, cap_input_gate, alignment
  )
  return (hs, new_carry), (params, inputs, carry, state_mask, steps, hs, saved)


def _recurrence_bwd(dtype, unroll, cap_input_gate, alignment, residuals, cotangents):
  params, inputs, (latent0, c0, h0), state_mask, steps, hs, saved = residuals
  d_hs, (d_latent_last, d_c_last, d_h_last) = cotangents
  h_prev = shifted(h0, hs)
  factors = step_factors(params, saved, c0, latent0, cap_input_gate)
  weights_t = transposed_weights(params, dtype, alignment)

  def step(carry, xs):
    d_latent, d_c, d_h_next, d_mask = carry
    d_h_out, x, h_prev_t, factors_t, valid = xs
    d_c, d_latent, d_x, d_h_in, _, products = adapted_step_backward(
      params,
      weights_t,
      own(valid, d_h_out) + d_h_next,
      d_c,
      d_latent,
      x,
      h_prev_t * state_mask,
      factors_t,
      dtype=dtype,
    )
    previous = (
      d_latent,
      d_c,
      (d_h_in * state_mask).astype(h0.dtype),
      (d_mask + d_h_in * h_prev_t).astype(d_mask.dtype),
    )
    return held(valid, previous, carry), own(valid, (*products, d_x))

  (d_latent0, d_c0, d_h0, d_mask), (d_gates, d_policy_in, d_latent_gates, d_inputs) = jax.lax.scan(
    step,
    (d_latent_last, d_c_last, d_h_last, jnp.zeros_like(state_mask)),
    (d_hs, inputs, h_prev, factors, steps),
    reverse=True,
    unroll=unroll,
  )
  zs = saved[5]
  z_prev = shifted(latent0[1], zs) if is_recurrent(params) else None
  grads = weight_gradients(
    params,
    inputs,
    h_prev * state_mask,
    saved[2],
    zs,
    d_gates,
    d_policy_in,
    d_latent_gates,
    z_prev,
    dtype,
  )
  return grads, d_inputs, (d_latent0, d_c0, d_h0), d_mask, None


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def alstm_recurrence(
  inputs: jax.Array,
  params: Any,
  carry: Any,
  state_mask: jax.Array | None = None,
  dtype: Any = None,
  unroll: int = 1,
  cap_input_gate: bool = False,
  steps: jax.Array | None = None,
):
  """The aLSTM over a window, differentiated by the backward pass above.

  Args:
    inputs: x_1..x_T, (T, B, m).
    params: an `ALSTMCell`'s parameters (latent `LSTMCell` or `StaticLatent`).
    carry: (latent carry, c_0, h_0) as `ALSTMCell.initialize_carry` makes it.
    state_mask: multiplies h_{t-1} wherever the step reads it (variational
      dropout on the state), broadcastable to (B, n); None keeps h.
    dtype: the products' operand dtype (None: the inputs'); bfloat16 sums in
      float32 (`products.contract`), the gates and states stay float32.
    unroll: scan steps per loop iteration, forward and backward.
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    steps: (T,) bool, the window's own steps (`lm_zoo.cells.held_steps`).

  Returns:
    ((latent carry, c_T, h_T), outputs h_1..h_T of shape (T, B, n)).
  """
  h0 = carry[-1]
  n = h0.shape[-1]
  check_window(inputs, params, n)
  hs, new_carry = _recurrence(
    params,
    inputs,
    tuple(carry),
    broadcast_state_mask(state_mask, h0),
    check_steps(steps, inputs.shape[0]),
    product_dtype(dtype, inputs.dtype),
    unroll,
    cap_input_gate,
    contraction_alignment(),
  )
  return new_carry, hs
