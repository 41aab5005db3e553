"""The LSTM recurrence over a whole window with a hand-written backward pass.

Given the hoisted input projections P_t = W x_t + b (T, B, 4n), the recurrent
kernel U (n, 4n) and the carry (c_0, h_0), `lstm_recurrence` runs

    [i, f, j, o] = P_t + (m ⊙ h_{t-1}) U
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),   h_t = σ(o) ⊙ tanh(c_t)

(docs/models.md §1; m is an optional dropout mask on the fed-back state)
as one `lax.scan`; with the capped input gate of lamb's `tiled_lstm.py`,
c_t = σ(f) ⊙ c_{t-1} + min(1 - σ(f), σ(i)) ⊙ tanh(j). Autodiff of that scan would
add the rank-B product
(m ⊙ h_{t-1})ᵀ dG_t into the (n, 4n) gradient of U at every step, a pass over
the whole matrix per time step. The custom VJP here keeps only dh_{t-1} =
dG_t Uᵀ in the backward scan and computes dU = Hᵀ dG as one (n, T·B) x
(T·B, 4n) product afterwards, as oneDNN's fused LSTM does.

The cell update forward and back here is also that of the other hand-written
windows (`mixed_lstm_recurrence`, `alstm_recurrence`); their Pallas forms take
`gate_factors` and `shifted` from here for their backward.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.held_steps import check_steps, held, own
from lm_zoo.layers.products import (
  aligned_product,
  aligned_rows,
  contract,
  contraction_alignment,
  product_dtype,
)


def gate_activations(gates: jax.Array) -> jax.Array:
  """[σ(i), σ(f), tanh(j), σ(o)] in one elementwise pass: σ(x) = (tanh(x/2) + 1)/2."""
  n = gates.shape[-1] // 4
  is_sigmoid = jnp.arange(4 * n) // n != 2
  scale = jnp.where(is_sigmoid, 0.5, 1.0).astype(gates.dtype)
  return jnp.tanh(gates * scale) * scale + jnp.where(is_sigmoid, 0.5, 0.0).astype(gates.dtype)


def cell_update(act: jax.Array, c: jax.Array, h: jax.Array, cap_input_gate: bool):
  """(c', h') from the gate activations and the carry, in the carry's dtypes;
  `cap_input_gate` writes with min(1 - σ(f), σ(i)) in place of σ(i)."""
  i, f, j, o = jnp.split(act, 4, axis=-1)
  if cap_input_gate:
    i = jnp.minimum(1 - f, i)
  new_c = (f * c + i * j).astype(c.dtype)
  return new_c, (o * jnp.tanh(new_c)).astype(h.dtype)


def shifted(first, rest):
  """[first, rest_1, ..., rest_{T-1}]: the previous step's values."""
  return jnp.concatenate([first[None], rest[:-1]], axis=0)


def gate_factors(i, f, j, o, cs, c0, cap_input_gate):
  """Everything the backward pass needs that does not depend on the incoming
  gradients, for all steps at once (the scan then only chains d_c and d_h),
  from the activations σ(i), σ(f), tanh(j), σ(o) and the cell states c_1..c_T:
  σ(f), dc/dh through h = σ(o) tanh(c), and each gate's derivative factor
  (i, f, j, o), by which d_c (d_h for o) gives the gate's gradient.

  With the capped gate, dc/dσ(i) = tanh(j) where σ(i) < 1 - σ(f) and 0
  elsewhere, and dc/dσ(f) = c_{t-1} - tanh(j) where the cap binds (ties go
  to the cap, as TensorFlow's `minimum` sends them to its first argument)."""
  tanh_c = jnp.tanh(cs)
  c_prev = shifted(c0, cs)
  d_c_from_h = o * (1 - tanh_c * tanh_c)
  d_i, d_f, written = j, c_prev, i
  if cap_input_gate:
    below_cap = i < 1 - f
    d_i = jnp.where(below_cap, j, 0)
    d_f = c_prev - jnp.where(below_cap, 0, j)
    written = jnp.where(below_cap, i, 1 - f)
  scales = (d_i * i * (1 - i), d_f * f * (1 - f), written * (1 - j * j), tanh_c * o * (1 - o))
  return f, d_c_from_h, scales


def backward_factors(acts, cs, c0, cap_input_gate):
  """`gate_factors` of activations (T, B, 4n), the scales concatenated likewise."""
  f, d_c_from_h, scales = gate_factors(*jnp.split(acts, 4, axis=-1), cs, c0, cap_input_gate)
  return f, d_c_from_h, jnp.concatenate(scales, axis=-1)


def gates_gradient(d_c, d_h, d_c_from_h_t, gate_scales_t):
  """One backward step through the cell update: (d_c_t, dL/d gate pre-activations)."""
  d_c = d_c + d_h * d_c_from_h_t
  d_gates = gate_scales_t * jnp.concatenate([d_c, d_c, d_c, d_h], axis=-1)
  return d_c, d_gates.astype(gate_scales_t.dtype)


def previous_step_gradients(d_c, f_t, d_h_in, h_prev_t, state_mask, d_h_next, d_mask):
  """The backward carry for step t-1: dL/dc_{t-1} through c_t = σ(f) c_{t-1} + ...,
  dL/dh_{t-1} through the mask, and the mask's gradient summed so far."""
  return (
    (d_c * f_t).astype(d_c.dtype),
    (d_h_in * state_mask).astype(d_h_next.dtype),
    (d_mask + d_h_in * h_prev_t).astype(d_mask.dtype),
  )


def _forward_scan(
  projected, recurrent_kernel, c0, h0, state_mask, steps, dtype, unroll, cap_input_gate, alignment
):
  """Returns the outputs h_1..h_T (T, B, n), the final carry, and per step
  the gate activations (T, B, 4n) and cell states c_1..c_T (T, B, n). Few
  arrays per step: each is a separate write in every loop iteration."""
  kernel = aligned_rows(recurrent_kernel.astype(dtype), alignment)

  def step(carry, xs):
    p, valid = xs
    c, h = carry
    act = gate_activations(p + aligned_product(h * state_mask, kernel, dtype))
    new_c, new_h = cell_update(act, c, h, cap_input_gate)
    return held(valid, (new_c, new_h), carry), (own(valid, new_h), act, new_c)

  (c, h), (hs, acts, cs) = jax.lax.scan(step, (c0, h0), (projected, steps), unroll=unroll)
  return hs, (c, h), (acts, cs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _recurrence(
  projected, recurrent_kernel, c0, h0, state_mask, steps, dtype, unroll, cap_input_gate, alignment
):
  hs, carry, _ = _forward_scan(
    projected, recurrent_kernel, c0, h0, state_mask, steps, dtype, unroll, cap_input_gate, alignment
  )
  return hs, carry


def _recurrence_fwd(
  projected, recurrent_kernel, c0, h0, state_mask, steps, dtype, unroll, cap_input_gate, alignment
):
  hs, carry, (acts, cs) = _forward_scan(
    projected, recurrent_kernel, c0, h0, state_mask, steps, dtype, unroll, cap_input_gate, alignment
  )
  return (hs, carry), (recurrent_kernel, state_mask, steps, c0, h0, hs, acts, cs)


def _recurrence_bwd(dtype, unroll, cap_input_gate, alignment, saved, cotangents):
  recurrent_kernel, state_mask, steps, c0, h0, hs, acts, cs = saved
  d_hs, (d_c_last, d_h_last) = cotangents
  h_prev = shifted(h0, hs)
  f, d_c_from_h, gate_scales = backward_factors(acts, cs, c0, cap_input_gate)
  kernel_t = aligned_rows(recurrent_kernel.astype(dtype).T, alignment)

  def step(carry, xs):
    d_c, d_h_next, d_mask = carry
    d_h_out, h_prev_t, f_t, d_c_from_h_t, gate_scales_t, valid = xs
    d_c, d_gates = gates_gradient(d_c, own(valid, d_h_out) + d_h_next, d_c_from_h_t, gate_scales_t)
    d_h_in = aligned_product(d_gates, kernel_t, dtype)
    previous = previous_step_gradients(d_c, f_t, d_h_in, h_prev_t, state_mask, d_h_next, d_mask)
    return held(valid, previous, carry), own(valid, d_gates)

  (d_c0, d_h0, d_mask), d_gates = jax.lax.scan(
    step,
    (d_c_last, d_h_last, jnp.zeros_like(state_mask)),
    (d_hs, h_prev, f, d_c_from_h, gate_scales, steps),
    reverse=True,
    unroll=unroll,
  )
  n = h0.shape[-1]
  h_in = (h_prev * state_mask).reshape(-1, n)
  # The whole window's recurrent weight gradient in one matrix product.
  d_kernel = contract('mn,mk->nk', h_in, d_gates.reshape(-1, 4 * n), dtype)
  return d_gates, d_kernel.astype(recurrent_kernel.dtype), d_c0, d_h0, d_mask, None


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def _broadcasts(shape, target) -> bool:
  """Whether an array of `shape` broadcasts to `target` (numpy's rules, one way)."""
  if len(shape) > len(target):
    return False
  return all(a in (1, b) for a, b in zip(shape[::-1], target[::-1]))


def broadcast_state_mask(state_mask, h0):
  """The fed-back state's mask (None: all ones) broadcast to h0's shape and
  dtype. Raises ValueError, naming `state_mask`, for a mask that does not
  broadcast to h0 (batch, n): the windows failed deep in a kernel or scan."""
  if state_mask is not None and not _broadcasts(jnp.shape(state_mask), h0.shape):
    raise ValueError(
      f"state_mask: its shape {jnp.shape(state_mask)} does not broadcast to the carry's h "
      f'{h0.shape} (batch, n): pass one of that shape, (n,), (1, n) or (batch, 1)'
    )
  return jnp.broadcast_to(1 if state_mask is None else state_mask, h0.shape).astype(h0.dtype)


def lstm_recurrence(
  projected: jax.Array,
  recurrent_kernel: jax.Array,
  carry: tuple[jax.Array, jax.Array],
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  dtype: Any = None,
  cap_input_gate: bool = False,
  steps: jax.Array | None = None,
):
  """The LSTM over a window, differentiated with the batched weight gradient.

  Args:
    projected: W x_t + b for every step, (T, B, 4n), gate order i, f, j, o;
      its dtype is that of the gates and their gradients.
    recurrent_kernel: U, (n, 4n).
    carry: (c_0, h_0), each (B, n).
    state_mask: multiplies h_{t-1} before U (variational dropout on the
      state), broadcastable to (B, n); None keeps h.
    unroll: scan steps per loop iteration, forward and backward.
    dtype: the matrix products' operand dtype (None: the projections');
      bfloat16 sums in float32 (`products.contract`).
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    steps: (T,) bool, the window's own steps; the others hold the state and
      output zeros (`lm_zoo.cells.held_steps`). None: every step.

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)).
  """
  c0, h0 = carry
  if projected.ndim != 3 or projected.shape[-1] != recurrent_kernel.shape[-1]:
    raise ValueError(
      f'projected inputs {projected.shape} do not match the recurrent kernel '
      f'{recurrent_kernel.shape}: expected (T, B, {recurrent_kernel.shape[-1]})'
    )
  hs, new_carry = _recurrence(
    projected,
    recurrent_kernel,
    c0,
    h0,
    broadcast_state_mask(state_mask, h0),
    check_steps(steps, projected.shape[0]),
    product_dtype(dtype, projected.dtype),
    unroll,
    cap_input_gate,
    contraction_alignment(),
  )
  return new_carry, hs
