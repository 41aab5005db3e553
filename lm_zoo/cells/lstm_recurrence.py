"""The LSTM recurrence over a whole window with a hand-written backward pass.

Given the hoisted input projections P_t = W x_t + b (T, B, 4n), the recurrent
kernel U (n, 4n) and the carry (c_0, h_0), `lstm_recurrence` runs

    [i, f, j, o] = P_t + (m ⊙ h_{t-1}) U
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),   h_t = σ(o) ⊙ tanh(c_t)

(MODELS.md section 1; m is an optional dropout mask on the fed-back state)
as one `lax.scan`. Autodiff of that scan would add the rank-B product
(m ⊙ h_{t-1})ᵀ dG_t into the (n, 4n) gradient of U at every step, a pass over
the whole matrix per time step. The custom VJP here keeps only dh_{t-1} =
dG_t Uᵀ in the backward scan and computes dU = Hᵀ dG as one (n, T·B) x
(T·B, 4n) product afterwards, as oneDNN's fused LSTM does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _activations(gates: jax.Array) -> jax.Array:
  """[σ(i), σ(f), tanh(j), σ(o)] in one elementwise pass: σ(x) = (tanh(x/2) + 1)/2."""
  n = gates.shape[-1] // 4
  is_sigmoid = jnp.arange(4 * n) // n != 2
  scale = jnp.where(is_sigmoid, 0.5, 1.0).astype(gates.dtype)
  return jnp.tanh(gates * scale) * scale + jnp.where(is_sigmoid, 0.5, 0.0).astype(gates.dtype)


def _forward_scan(projected, recurrent_kernel, c0, h0, state_mask, unroll):
  """Returns the outputs h_1..h_T (T, B, n), the final carry, and per step
  the gate activations (T, B, 4n) and cell states c_1..c_T (T, B, n). Few
  arrays per step: each is a separate write in every loop iteration."""
  kernel = recurrent_kernel.astype(projected.dtype)

  def step(carry, p):
    c, h = carry
    act = _activations(p + (h * state_mask).astype(kernel.dtype) @ kernel)
    i, f, j, o = jnp.split(act, 4, axis=-1)
    new_c = (f * c + i * j).astype(c.dtype)
    new_h = (o * jnp.tanh(new_c)).astype(h.dtype)
    return (new_c, new_h), (new_h, act, new_c)

  (c, h), (hs, acts, cs) = jax.lax.scan(step, (c0, h0), projected, unroll=unroll)
  return hs, (c, h), (acts, cs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _recurrence(projected, recurrent_kernel, c0, h0, state_mask, unroll):
  hs, carry, _ = _forward_scan(projected, recurrent_kernel, c0, h0, state_mask, unroll)
  return hs, carry


def _recurrence_fwd(projected, recurrent_kernel, c0, h0, state_mask, unroll):
  hs, carry, (acts, cs) = _forward_scan(projected, recurrent_kernel, c0, h0, state_mask,
                                        unroll)
  return (hs, carry), (recurrent_kernel, state_mask, c0, h0, hs, acts, cs)


def _shifted(first, rest):
  """[first, rest_1, ..., rest_{T-1}]: the previous step's values."""
  return jnp.concatenate([first[None], rest[:-1]], axis=0)


def _recurrence_bwd(unroll, saved, cotangents):
  recurrent_kernel, state_mask, c0, h0, hs, acts, cs = saved
  d_hs, (d_c_last, d_h_last) = cotangents
  h_prev, c_prev = _shifted(h0, hs), _shifted(c0, cs)
  i, f, j, o = jnp.split(acts, 4, axis=-1)
  tanh_c = jnp.tanh(cs)
  # Everything that does not depend on the incoming gradients, for all steps
  # at once: the scan then only chains d_c and d_h through U.
  d_c_from_h = o * (1 - tanh_c * tanh_c)
  gate_scales = jnp.concatenate(
      [j * i * (1 - i), c_prev * f * (1 - f), i * (1 - j * j), tanh_c * o * (1 - o)], axis=-1)
  kernel_t = recurrent_kernel.astype(acts.dtype).T

  def step(carry, xs):
    d_c, d_h_next, d_mask = carry
    d_h_out, h_prev_t, f_t, d_c_from_h_t, gate_scales_t = xs
    d_h = d_h_out + d_h_next
    d_c = d_c + d_h * d_c_from_h_t
    d_gates = (gate_scales_t * jnp.concatenate([d_c, d_c, d_c, d_h], axis=-1)
               ).astype(gate_scales_t.dtype)
    d_h_in = d_gates @ kernel_t
    return ((d_c * f_t).astype(d_c.dtype), (d_h_in * state_mask).astype(d_h_next.dtype),
            (d_mask + d_h_in * h_prev_t).astype(d_mask.dtype)), d_gates

  (d_c0, d_h0, d_mask), d_gates = jax.lax.scan(
      step, (d_c_last, d_h_last, jnp.zeros_like(state_mask)),
      (d_hs, h_prev, f, d_c_from_h, gate_scales), reverse=True, unroll=unroll)
  n = h0.shape[-1]
  h_in = (h_prev * state_mask).astype(d_gates.dtype).reshape(-1, n)
  # The whole window's recurrent weight gradient in one matrix product.
  d_kernel = jnp.dot(h_in.T, d_gates.reshape(-1, 4 * n),
                     preferred_element_type=recurrent_kernel.dtype)
  return d_gates, d_kernel, d_c0, d_h0, d_mask


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def lstm_recurrence(projected: jax.Array, recurrent_kernel: jax.Array,
                    carry: tuple[jax.Array, jax.Array], state_mask: jax.Array | None = None,
                    unroll: int = 1):
  """The LSTM over a window, differentiated with the batched weight gradient.

  Args:
    projected: W x_t + b for every step, (T, B, 4n), gate order i, f, j, o;
      its dtype is the computation dtype.
    recurrent_kernel: U, (n, 4n).
    carry: (c_0, h_0), each (B, n).
    state_mask: multiplies h_{t-1} before U (variational dropout on the
      state), broadcastable to (B, n); None keeps h.
    unroll: scan steps per loop iteration, forward and backward.

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)).
  """
  c0, h0 = carry
  if projected.ndim != 3 or projected.shape[-1] != recurrent_kernel.shape[-1]:
    raise ValueError(f'projected inputs {projected.shape} do not match the recurrent kernel '
                     f'{recurrent_kernel.shape}: expected (T, B, {recurrent_kernel.shape[-1]})')
  mask = jnp.broadcast_to(1 if state_mask is None else state_mask, h0.shape).astype(h0.dtype)
  hs, new_carry = _recurrence(projected, recurrent_kernel, c0, h0, mask, unroll)
  return new_carry, hs
