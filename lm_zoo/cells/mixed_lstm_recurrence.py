"""The LSTM over a window whose gates read a mix of its input and state, with a
hand-written backward pass.

`mixed_lstm_recurrence` runs `lstm_recurrence`'s LSTM (docs/models.md §1)
with gates that read x'_t and h'_{t-1} computed from x_t and h_{t-1} by a
small function (the Mogrifier's rounds, docs/models.md §2): W x' cannot be
hoisted then, so the scan runs [x', h'] [W; U] as one product per step, and
both W's and U's gradients are one product each after the backward scan.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from lm_zoo.cells.held_steps import check_steps, held, own
from lm_zoo.cells.lstm_recurrence import (
  backward_factors,
  broadcast_state_mask,
  cell_update,
  gate_activations,
  gates_gradient,
  previous_step_gradients,
  shifted,
)
from lm_zoo.cells.mogrifier import MogrifierRounds
from lm_zoo.layers.products import (
  accumulation_dtype,
  aligned_product,
  aligned_rows,
  contract,
  contraction_alignment,
  product_dtype,
)


class Mix(Protocol):
  """What the gates of `mixed_lstm_recurrence` read in place of x_t and
  h_{t-1}: a pure, per-step map (θ, x, h) -> (x', h') of the same widths,
  with its backward pass split so that the window's parameter gradient is
  computed once, from all steps at once (`Mogrifier`'s rounds do this)."""

  def forward(
    self, params: Any, x: jax.Array, h: jax.Array
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One step: (x', h', residuals (B, r)), the residuals kept for the backward pass."""

  def backward(
    self,
    params: Any,
    x: jax.Array,
    h: jax.Array,
    residuals: jax.Array,
    d_mixed_x: jax.Array,
    d_mixed_h: jax.Array,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One step back: (dL/dx, dL/dh, stash (B, s)), the stash kept for `params_gradient`."""

  def params_gradient(
    self, params: Any, xs: jax.Array, hs: jax.Array, residuals: jax.Array, stashes: jax.Array
  ) -> Any:
    """dL/dθ from every step's inputs, residuals and stash, each (T, B, ...)."""


class _Settings(NamedTuple):
  """The window's static arguments: the products' dtype, the scans' unroll,
  the capped input gate, `contraction_alignment`, and the forward pass and
  the backward chain (None: `lax.scan`; else a `ForwardPass`, a
  `BackwardChain`)."""

  dtype: Any
  unroll: int
  cap_input_gate: bool
  alignment: int
  forward: Any = None
  backward: Any = None


class ForwardPass(Protocol):
  """Another way to run the forward pass (a kernel) for the hand-written
  backward: hashable, called as forward(mix, mix_params, (W, b, U), inputs,
  (c_0, h_0), state_mask (B, n), cap_input_gate) and returning what
  `mixed_lstm_forward` returns, with `mixed` in the products' dtype."""

  def __call__(self, mix, mix_params, weights, inputs, carry, state_mask, cap_input_gate): ...


class BackwardChain(Protocol):
  """Another way to run the backward chain (a kernel): hashable, called as
  backward(mix, mix_params, (W, b, U), inputs, (c_0, h_0), state_mask (B,
  n), hs, per_step, cotangents, cap_input_gate) and returning what
  `mixed_lstm_backward_chain` returns; the weight gradients stay products
  over the window after it."""

  def __call__(
    self, mix, mix_params, weights, inputs, carry, state_mask, hs, per_step, cotangents, cap
  ): ...


def _forward_scan(mix, mix_params, weights, inputs, carry, state_mask, steps, settings):
  """The outputs h_1..h_T, the final carry, [W; U] in the products' dtype,
  and per step the gate activations, c_t, [x', h'] (the input of the gates'
  one matrix product) and mix's residuals."""
  input_kernel, bias, recurrent_kernel = weights
  dtype = settings.dtype
  kernel = jnp.concatenate([input_kernel, recurrent_kernel], axis=0).astype(dtype)
  aligned_kernel = aligned_rows(kernel, settings.alignment)
  bias = bias.astype(accumulation_dtype(dtype))

  def step(carry, xs):
    x, valid = xs
    c, h = carry
    mixed_x, mixed_h, residuals = mix.forward(mix_params, x, h * state_mask)
    mixed = jnp.concatenate([mixed_x, mixed_h], axis=-1).astype(dtype)
    act = gate_activations(aligned_product(mixed, aligned_kernel, dtype) + bias)
    new_c, new_h = cell_update(act, c, h, settings.cap_input_gate)
    return held(valid, (new_c, new_h), carry), (own(valid, new_h), act, new_c, mixed, residuals)

  new_carry, (hs, *per_step) = jax.lax.scan(step, carry, (inputs, steps), unroll=settings.unroll)
  return hs, new_carry, kernel, per_step


def _forward(mix, mix_params, weights, inputs, carry, state_mask, steps, settings):
  """hs, the final carry, [W; U] in the products' dtype (what the backward
  scan multiplies by; None for a `BackwardChain`) and the per-step
  residuals, from `settings.forward` if set (no held steps then)."""
  if settings.forward is None:
    return _forward_scan(mix, mix_params, weights, inputs, carry, state_mask, steps, settings)
  hs, new_carry, per_step = settings.forward(
    mix, mix_params, weights, inputs, carry, state_mask, settings.cap_input_gate
  )
  kernel = None
  if settings.backward is None:
    input_kernel, _, recurrent_kernel = weights
    kernel = jnp.concatenate([input_kernel, recurrent_kernel], axis=0).astype(settings.dtype)
  return hs, new_carry, kernel, per_step


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 7))
def _recurrence(mix, mix_params, weights, inputs, carry, state_mask, steps, settings):
  hs, new_carry, _, _ = _forward(
    mix, mix_params, weights, inputs, carry, state_mask, steps, settings
  )
  return hs, new_carry


def _recurrence_fwd(mix, mix_params, weights, inputs, carry, state_mask, steps, settings):
  hs, new_carry, kernel, per_step = _forward(
    mix, mix_params, weights, inputs, carry, state_mask, steps, settings
  )
  saved = (mix_params, weights, kernel, inputs, carry, state_mask, steps, hs, per_step)
  return (hs, new_carry), saved


def _weight_gradients(weights, mixed, d_gates, dtype):
  """dL/d(W, b, U) from every step's [x', h'] and gate gradients."""
  input_kernel, bias, recurrent_kernel = weights
  m = input_kernel.shape[0]
  d_gates = d_gates.reshape(-1, d_gates.shape[-1])
  accumulate = jnp.promote_types(input_kernel.dtype, jnp.float32)
  # W's and U's gradients for the whole window in one matrix product.
  d_kernel = contract('tm,tk->mk', mixed.reshape(-1, mixed.shape[-1]), d_gates, dtype)
  return (
    d_kernel[:m].astype(input_kernel.dtype),
    jnp.sum(d_gates, axis=0, dtype=accumulate).astype(bias.dtype),
    d_kernel[m:].astype(recurrent_kernel.dtype),
  )


def _backward_scan(
  mix, mix_params, kernel, inputs, carry, state_mask, steps, hs, per_step, cotangents, settings
):
  """The backward chain in reverse, a step at a time: ((dL/dc_0, dL/dh_0,
  dL/d state_mask), (every step's gate gradients, dL/dx_t and mix's stash))."""
  (c0, h0), (acts, _, _, residuals) = carry, per_step
  d_hs, d_carry_last = cotangents
  h_prev = shifted(h0, hs)
  f, d_c_from_h, gate_scales = backward_factors(acts, per_step[1], c0, settings.cap_input_gate)
  kernel_t = aligned_rows(kernel.T, settings.alignment)
  m = inputs.shape[-1]

  def step(carry, xs):
    d_c, d_h_next, d_mask = carry
    d_h_out, x_t, h_prev_t, f_t, d_c_from_h_t, gate_scales_t, residuals_t, valid = xs
    d_c, d_gates = gates_gradient(d_c, own(valid, d_h_out) + d_h_next, d_c_from_h_t, gate_scales_t)
    d_mixed = aligned_product(d_gates, kernel_t, settings.dtype)
    d_x, d_h_in, stash = mix.backward(
      mix_params,
      x_t,
      h_prev_t * state_mask,
      residuals_t,
      d_mixed[..., :m].astype(x_t.dtype),
      d_mixed[..., m:].astype(h_prev_t.dtype),
    )
    previous = previous_step_gradients(d_c, f_t, d_h_in, h_prev_t, state_mask, d_h_next, d_mask)
    return held(valid, previous, carry), own(valid, (d_gates, d_x, stash))

  return jax.lax.scan(
    step,
    (*d_carry_last, jnp.zeros_like(state_mask)),
    (d_hs, inputs, h_prev, f, d_c_from_h, gate_scales, residuals, steps),
    reverse=True,
    unroll=settings.unroll,
  )


def _recurrence_bwd(mix, settings, saved, cotangents):
  mix_params, weights, kernel, inputs, carry, state_mask, steps, hs, per_step = saved
  if settings.backward is None:
    chain = _backward_scan(
      mix, mix_params, kernel, inputs, carry, state_mask, steps, hs, per_step, cotangents, settings
    )
  else:
    chain = settings.backward(
      mix,
      mix_params,
      weights,
      inputs,
      carry,
      state_mask,
      hs,
      per_step,
      cotangents,
      settings.cap_input_gate,
    )
  (d_c0, d_h0, d_mask), (d_gates, d_inputs, stashes) = chain
  h_in = shifted(carry[1], hs) * state_mask
  d_mix_params = mix.params_gradient(mix_params, inputs, h_in, per_step[3], stashes)
  d_weights = _weight_gradients(weights, per_step[2], d_gates, settings.dtype)
  return d_mix_params, d_weights, d_inputs, (d_c0, d_h0), d_mask, None


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def check_shapes(inputs, input_kernel, bias, recurrent_kernel, n):
  """Raises ValueError unless the inputs and weights fit an LSTM of n units."""
  m = inputs.shape[-1]
  if (
    inputs.ndim != 3
    or input_kernel.shape != (m, 4 * n)
    or recurrent_kernel.shape != (n, 4 * n)
    or bias.shape != (4 * n,)
  ):
    raise ValueError(
      f'inputs {inputs.shape}, W {input_kernel.shape}, U '
      f'{recurrent_kernel.shape} and b {bias.shape} do not fit an LSTM of '
      f'{n} units: expected (T, B, m), ({m}, {4 * n}), ({n}, {4 * n}), ({4 * n},)'
    )


def check_mix_params(mix: Mix, mix_params: Any) -> None:
  """Raises ValueError unless a `MogrifierRounds` mix gets exactly its rounds'
  parameters (other mixes read theirs as they will)."""
  if isinstance(mix, MogrifierRounds):
    mix.check_params(mix_params)


def mixed_lstm_forward(
  inputs: jax.Array,
  input_kernel: jax.Array,
  bias: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  mix: Mix,
  mix_params: Any,
  state_mask: jax.Array | None = None,
  dtype: Any = None,
  cap_input_gate: bool = False,
):
  """`mixed_lstm_recurrence`'s forward pass alone, with what its backward
  pass keeps of every step: the reference of a `ForwardPass`.

  Returns:
    (outputs h_1..h_T (T, B, n), (c_T, h_T), (gate activations [σ(i), σ(f),
    tanh(j), σ(o)] (T, B, 4n), c_1..c_T (T, B, n), [x', h'] (T, B, m + n)
    in `dtype`, mix's residuals (T, B, r))).
  """
  h0 = carry[1]
  check_shapes(inputs, input_kernel, bias, recurrent_kernel, h0.shape[-1])
  check_mix_params(mix, mix_params)
  settings = _Settings(
    product_dtype(dtype, inputs.dtype), 1, cap_input_gate, contraction_alignment()
  )
  weights = (input_kernel, bias, recurrent_kernel)
  mask = broadcast_state_mask(state_mask, h0)
  hs, new_carry, _, per_step = _forward_scan(
    mix, mix_params, weights, inputs, tuple(carry), mask, None, settings
  )
  return hs, new_carry, tuple(per_step)


def mixed_lstm_backward_chain(
  cotangents,
  inputs: jax.Array,
  input_kernel: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  mix: Mix,
  mix_params: Any,
  state_mask: jax.Array,
  hs: jax.Array,
  per_step,
  dtype: Any = None,
  cap_input_gate: bool = False,
):
  """`mixed_lstm_recurrence`'s backward chain alone, from the cotangents
  (dL/dh_1..h_T (T, B, n), (dL/dc_T, dL/dh_T)) and what `mixed_lstm_forward`
  kept (`hs`, `per_step`): the reference of a kernel's. The weight
  gradients are not in it: they are products over the window after it.

  Returns:
    ((dL/dc_0, dL/dh_0, dL/d state_mask), (dL/d gate pre-activations
    (T, B, 4n), dL/dx_t (T, B, m), mix's stash (T, B, s))).
  """
  check_mix_params(mix, mix_params)
  dtype = product_dtype(dtype, inputs.dtype)
  settings = _Settings(dtype, 1, cap_input_gate, contraction_alignment())
  kernel = jnp.concatenate([input_kernel, recurrent_kernel], axis=0).astype(dtype)
  mask = broadcast_state_mask(state_mask, carry[1])
  return _backward_scan(
    mix,
    mix_params,
    kernel,
    inputs,
    tuple(carry),
    mask,
    None,
    hs,
    tuple(per_step),
    cotangents,
    settings,
  )


def mixed_lstm_recurrence(
  inputs: jax.Array,
  input_kernel: jax.Array,
  bias: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  mix: Mix,
  mix_params: Any,
  state_mask: jax.Array | None = None,
  dtype: Any = None,
  unroll: int = 1,
  cap_input_gate: bool = False,
  steps: jax.Array | None = None,
  forward: ForwardPass | None = None,
  backward: BackwardChain | None = None,
):
  """The LSTM over a window whose gates read (x'_t, h'_{t-1}) = mix(θ, x_t, m ⊙ h_{t-1}):

      [i, f, j, o] = x'_t W + h'_{t-1} U + b,

  then c_t and h_t as in `lstm_recurrence`. The backward pass is written by
  hand around `mix.backward`: W's and U's gradients are one
  ((m + n), T·B) x (T·B, 4n) product after the backward scan, and θ's
  gradient is `mix.params_gradient` of every step at once.

  Args:
    inputs: x_1..x_T, (T, B, m).
    input_kernel: W, (m, 4n); gate order i, f, j, o.
    bias: b, (4n,).
    recurrent_kernel: U, (n, 4n).
    carry: (c_0, h_0), each (B, n).
    mix: a hashable `Mix` (its methods are pure functions of their arguments).
    mix_params: θ, a pytree of arrays.
    state_mask: multiplies h_{t-1} before mix (variational dropout on the
      state), broadcastable to (B, n); None keeps h.
    dtype: the operand dtype of the gates' products (None: the inputs');
      bfloat16 sums in float32 and computes the gates in float32
      (`products.contract`).
    unroll: scan steps per loop iteration, forward and backward.
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    steps: (T,) bool, the window's own steps, as `lstm_recurrence`'s.
    forward: runs the forward pass in place of `lax.scan` (a kernel; it
      takes no `steps`); the backward pass stays this one.
    backward: runs the backward chain in place of `lax.scan` (a kernel; no
      `steps`); the weight gradients stay products over the window.

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)).
  """
  check_shapes(inputs, input_kernel, bias, recurrent_kernel, carry[1].shape[-1])
  check_mix_params(mix, mix_params)
  if (forward, backward) != (None, None) and steps is not None:
    raise ValueError('a forward or backward pass of its own runs no held steps: pass steps=None')
  dtype = product_dtype(dtype, inputs.dtype)
  settings = _Settings(dtype, unroll, cap_input_gate, contraction_alignment(), forward, backward)
  weights = (input_kernel, bias, recurrent_kernel)
  mask, steps = broadcast_state_mask(state_mask, carry[1]), check_steps(steps, inputs.shape[0])
  hs, new_carry = _recurrence(mix, mix_params, weights, inputs, tuple(carry), mask, steps, settings)
  return new_carry, hs
