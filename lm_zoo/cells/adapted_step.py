"""One step of the aLSTM (`ALSTMCell`, docs/models.md §3) forward and back,
and the weight gradients of a window of them: what the hand-written windows
(`alstm_recurrence`, `lstm_rhn_recurrence`, `pallas_alstm_recurrence`) share.

One step of the cell, with m ⊙ h_{t-1} the fed-back state under its mask:

    v = [x; m ⊙ h_{t-1}]
    z = LSTM(v, z_{t-1})  (eq. 7)   or   z = ReLU(v W_z + b_z)  (eq. 6)
    π = tanh(z P) = [π_x | π_h | π_W | π_V | π_b]
    a = (π_x ⊙ x) W,   r = (π_h ⊙ m ⊙ h_{t-1}) V
    [i, f, j, o] = π_W ⊙ a + π_V ⊙ r + π_b ⊙ b,   then c_t, h_t as the LSTM.

Backward, from the gates' gradient g (as in `lstm_recurrence`):

    dπ_W = g ⊙ a,  dπ_V = g ⊙ r,  dπ_b = g ⊙ b,
    d(π_x ⊙ x) = (g ⊙ π_W) Wᵀ,  d(π_h ⊙ h) = (g ⊙ π_V) Vᵀ,
    dπ_x = d(π_x ⊙ x) ⊙ x,  dπ_h = d(π_h ⊙ h) ⊙ m ⊙ h_{t-1},
    q = dπ ⊙ (1 - π²),  dz = q Pᵀ,

then back through the latent (an LSTM step with its own carry, or the ReLU)
to dv = [dx; d(m ⊙ h_{t-1})]. A window's backward scan keeps only the
per-step products of those chains; every weight gradient is one product over
the window's T·B rows after it: dW = Σ (π_x ⊙ x)ᵀ (g ⊙ π_W), dV likewise,
db = Σ g ⊙ π_b, dP = Σ zᵀ q, and the latent's dW_z = Σ vᵀ g_z, dU_z =
Σ z_{t-1}ᵀ g_z, db_z = Σ g_z.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.lstm_recurrence import (
  backward_factors,
  cell_update,
  gate_activations,
  gates_gradient,
)
from lm_zoo.layers.adaptive import split_sizes
from lm_zoo.layers.products import (
  accumulation_dtype,
  aligned_product,
  aligned_rows,
  contract,
)


def is_recurrent(params) -> bool:
  """Whether the latent is an `LSTMCell` (eq. 7) rather than `StaticLatent` (eq. 6)."""
  return 'recurrent_kernel' in params['latent']


def latent_dense(params):
  latent = params['latent']
  return latent['input'] if is_recurrent(params) else latent['Dense_0']


def policy_sizes(m, n):
  return (m, n, 4 * n, 4 * n, 4 * n)


def step_weights(params, dtype, alignment):
  """The latent's W_z, its U_z (None for a static latent), P, W and V in the
  products' dtype, each from `aligned_rows`: what `adapted_step` multiplies
  by, made once before a window's loop."""
  latent = params['latent']
  recurrent = latent['recurrent_kernel'] if is_recurrent(params) else None
  return tuple(
    None if kernel is None else aligned_rows(kernel.astype(dtype), alignment)
    for kernel in (
      latent_dense(params)['kernel'],
      recurrent,
      params['policy']['kernel'],
      params['input']['kernel_1'],
      params['recurrent']['kernel_1'],
    )
  )


def adapted_step(
  params, weights, x, h_in, c, latent_carry, context=(), latent_mask=None, *, dtype, cap_input_gate
):
  """One step of the aLSTM with parameters `params` (`weights`: their
  `step_weights`) from the input x, the masked fed-back state h_in, the cell
  state c and the latent's carry; `context` (a tuple of arrays, or ())
  extends the latent's input v, and `latent_mask` (or None) multiplies z
  where the latent makes it.

  Returns:
    ((latent carry, c_t, h_t), what the backward step reads: the gate
    activations, c_t, π, a, r, z and the latent's gate activations and cell
    state (recurrent latent) or nothing (static)).
  """
  m, n = x.shape[-1], c.shape[-1]
  latent_kernel, latent_recurrent_kernel, policy, kernel, recurrent_kernel = weights
  accumulate = accumulation_dtype(dtype)
  v = jnp.concatenate([x, h_in, *context], axis=-1)
  projected = aligned_product(v, latent_kernel, dtype) + latent_dense(params)['bias'].astype(
    accumulate
  )
  if is_recurrent(params):
    c_z, z_prev = latent_carry
    act_z = gate_activations(projected + aligned_product(z_prev, latent_recurrent_kernel, dtype))
    c_z, z = cell_update(act_z, c_z, z_prev, False)
    if latent_mask is not None:
      z = z * latent_mask
    latent_carry, latent_saved = (c_z, z), (act_z, c_z)
  else:
    z, latent_saved = jax.nn.relu(projected), ()
    if latent_mask is not None:
      z = z * latent_mask
  pi = jnp.tanh(aligned_product(z, policy, dtype))
  x_scale, h_scale, w_scale, v_scale, b_scale = split_sizes(pi, policy_sizes(m, n))
  a = aligned_product(x * x_scale, kernel, dtype)
  r = aligned_product(h_in * h_scale, recurrent_kernel, dtype)
  act = gate_activations(a * w_scale + (r * v_scale + params['recurrent']['bias'] * b_scale))
  new_c, new_h = cell_update(act, c, h_in, cap_input_gate)
  return (latent_carry, new_c, new_h), (act, new_c, pi, a, r, z, latent_saved)


def _transposed(kernel, dtype, alignment):
  return aligned_rows(kernel.astype(dtype).T, alignment)


def transposed_weights(params, dtype, alignment):
  """Wᵀ, Vᵀ, Pᵀ and the latent's [W_z; U_z]ᵀ (W_zᵀ for a static latent) in
  the products' dtype, each from `aligned_rows`: what
  `adapted_step_backward` multiplies by."""
  latent_kernel = latent_dense(params)['kernel']
  if is_recurrent(params):
    latent_kernel = jnp.concatenate([latent_kernel, params['latent']['recurrent_kernel']], 0)
  return tuple(
    _transposed(kernel, dtype, alignment)
    for kernel in (
      params['input']['kernel_1'],
      params['recurrent']['kernel_1'],
      params['policy']['kernel'],
      latent_kernel,
    )
  )


def step_factors(params, saved, c0, latent0, cap_input_gate):
  """What the backward step reads that the incoming gradients do not change,
  for all steps at once, from the forward steps' `saved` (each (T, ...)):
  per step σ(f), dc/dh, the gate scales, π, a, r and the latent's factors
  (its σ(f), dc/dz and gate scales; or where z > 0 for a static latent)."""
  acts, cs, pis, a_s, rs, zs, latent_saved = saved
  f, d_c_from_h, gate_scales = backward_factors(acts, cs, c0, cap_input_gate)
  if is_recurrent(params):
    acts_z, cs_z = latent_saved
    latent_factors = backward_factors(acts_z, cs_z, latent0[0], False)
  else:
    latent_factors = (zs > 0,)
  return f, d_c_from_h, gate_scales, pis, a_s, rs, latent_factors


def adapted_step_backward(
  params, weights_t, d_h, d_c, d_latent, x, h_in, factors, latent_mask=None, *, dtype
):
  """One step of the aLSTM back (the module docstring's equations), from
  dL/dh_t `d_h`, dL/dc_t `d_c` and the latent carry's gradient `d_latent`
  (for a recurrent latent (dL/dc_z, dL/dz) from the steps after, z as the
  carry holds it: masked); `factors`: this step's `step_factors`,
  `weights_t`: `transposed_weights`.

  Returns:
    (dL/dc_{t-1}, the latent carry's gradient for step t-1, dL/dx,
    dL/dh_in, dL/d context (the latent input's columns after [x; h_in]),
    the step's products (g, q, g_z) that the weight gradients sum).
  """
  kernel_t, recurrent_kernel_t, policy_t, latent_kernel_t = weights_t
  f_t, d_c_from_h_t, gate_scales_t, pi, a, r, latent_t = factors
  m, n = x.shape[-1], h_in.shape[-1]
  d_c, d_gates = gates_gradient(d_c, d_h, d_c_from_h_t, gate_scales_t)
  x_scale, h_scale, w_scale, v_scale, b_scale = split_sizes(pi, policy_sizes(m, n))
  d_x_scaled = aligned_product(d_gates * w_scale, kernel_t, dtype)
  d_h_scaled = aligned_product(d_gates * v_scale, recurrent_kernel_t, dtype)
  d_pi = jnp.concatenate(
    [
      d_x_scaled * x,
      d_h_scaled * h_in,
      d_gates * a,
      d_gates * r,
      d_gates * params['recurrent']['bias'],
    ],
    axis=-1,
  )
  d_policy_in = (d_pi * (1 - pi * pi)).astype(pi.dtype)
  d_z = aligned_product(d_policy_in, policy_t, dtype)
  v_size = latent_dense(params)['kernel'].shape[0]
  if is_recurrent(params):
    d_c_z, d_z_next = d_latent
    f_z, d_c_z_from_z, scales_z = latent_t
    d_z = d_z + d_z_next
    if latent_mask is not None:
      d_z = d_z * latent_mask
    d_c_z, d_latent_gates = gates_gradient(d_c_z, d_z, d_c_z_from_z, scales_z)
    d_v = aligned_product(d_latent_gates, latent_kernel_t, dtype)
    d_latent = ((d_c_z * f_z).astype(d_c_z.dtype), d_v[:, v_size:].astype(d_z_next.dtype))
  else:
    (positive,) = latent_t
    if latent_mask is not None:
      d_z = d_z * latent_mask
    d_latent_gates = jnp.where(positive, d_z, 0)
    d_v = aligned_product(d_latent_gates, latent_kernel_t, dtype)
  d_x = (d_x_scaled * x_scale + d_v[:, :m]).astype(x.dtype)
  d_h_in = d_h_scaled * h_scale + d_v[:, m : m + n]
  return (
    (d_c * f_t).astype(d_c.dtype),
    d_latent,
    d_x,
    d_h_in,
    d_v[:, m + n : v_size],
    (d_gates, d_policy_in, d_latent_gates),
  )


def weight_gradients(
  params, inputs, h_in, pis, zs, d_gates, d_policy_in, d_latent_gates, z_prev, dtype, context=None
):
  """Every weight's gradient, each one product (or sum) over the window's T·B
  rows; `context`: the columns of the latent's input after [x; h_in], if any."""
  m, n = inputs.shape[-1], h_in.shape[-1]
  rows = lambda a: a.reshape(-1, a.shape[-1])
  x_scale, h_scale, w_scale, v_scale, b_scale = split_sizes(rows(pis), policy_sizes(m, n))
  d_gates = rows(d_gates)
  product = lambda a, b, like: contract('tm,tk->mk', a, b, dtype).astype(like.dtype)
  column_sum = lambda a, like: jnp.sum(
    a, axis=0, dtype=jnp.promote_types(like.dtype, jnp.float32)
  ).astype(like.dtype)
  bias = params['recurrent']['bias']
  d_latent_gates = rows(d_latent_gates)
  dense = latent_dense(params)
  v = jnp.concatenate(
    [rows(inputs), rows(h_in)] + ([] if context is None else [rows(context)]), axis=-1
  )
  d_dense = {
    'kernel': product(v, d_latent_gates, dense['kernel']),
    'bias': column_sum(d_latent_gates, dense['bias']),
  }
  if z_prev is None:
    d_latent = {'Dense_0': d_dense}
  else:
    d_latent = {
      'input': d_dense,
      'recurrent_kernel': product(
        rows(z_prev), d_latent_gates, params['latent']['recurrent_kernel']
      ),
    }
  return {
    'input': {
      'kernel_1': product(rows(inputs) * x_scale, d_gates * w_scale, params['input']['kernel_1'])
    },
    'recurrent': {
      'kernel_1': product(rows(h_in) * h_scale, d_gates * v_scale, params['recurrent']['kernel_1']),
      'bias': column_sum(d_gates * b_scale, bias),
    },
    'policy': {'kernel': product(rows(zs), rows(d_policy_in), params['policy']['kernel'])},
    'latent': d_latent,
  }


def check_window(inputs: jax.Array, params: Any, n: int) -> None:
  """Raises ValueError unless `inputs` is (T, B, m) and fits the aLSTM input
  kernel W (m, 4n)."""
  if inputs.ndim != 3 or params['input']['kernel_1'].shape != (inputs.shape[-1], 4 * n):
    raise ValueError(
      f'inputs {inputs.shape} do not fit the aLSTM input kernel '
      f'{params["input"]["kernel_1"].shape}: expected (T, B, m) with W (m, {4 * n})'
    )
