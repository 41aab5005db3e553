"""aLSTM layers wired as the LSTM-RHN (`LSTMRHNStack`, docs/models.md §3,
eq. 9) over a whole window, with a hand-written backward pass.

Every step runs the layers bottom to top, layer l as one aLSTM step
(`lm_zoo.cells.adapted_step`) whose latent LSTM reads

    v^(l)_t = [x^(l)_t; s^(l) ⊙ h^(l)_{t-1}; z^(l-1)_t],
    x^(1)_t = x_t,  x^(l)_t = d^(l) ⊙ h^(l-1)_t,  z^(0)_t = z^(L)_{t-1},

with z^(l)_t = e^(l) ⊙ LSTM_z(v^(l)_t, z^(l)_{t-1}) the latent after its
mask (what the policy, the latent's own carry and the layer above read),
and s, d, e the optional variational dropout masks on each layer's fed-back
state, on the output of the layer below, and on the latent: one per window.

The backward scan runs the steps from last to first and, within a step, the
layers from top to bottom, so that layer l's dL/dh^(l)_t (from the output or
from layer l+1's dx^(l+1) ⊙ d^(l+1), plus the next step's) and dL/dz^(l)_t
(from its policy, its next step, and layer l+1's context columns of dv) are
complete when it is reached; layer 1's context columns go to the top layer's
dL/dz^(L)_{t-1} in the carry. Each layer's step back is the single aLSTM's
(`adapted_step_backward`), and every weight gradient of
every layer is one product over the window's T·B rows after the scan, as
for the single aLSTM.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from lm_zoo.cells.adapted_step import (
  adapted_step,
  adapted_step_backward,
  step_factors,
  step_weights,
  transposed_weights,
  weight_gradients,
)
from lm_zoo.cells.held_steps import check_steps, held, own
from lm_zoo.cells.lstm_recurrence import shifted
from lm_zoo.layers.products import contraction_alignment, product_dtype


class LayerMasks(NamedTuple):
  """One layer's dropout masks, each broadcastable to (B, its width), or None.

  Attributes:
    hidden: on the output of the layer below, the layer's input (d above;
      none for the first layer).
    state: on the layer's fed-back h (s).
    latent: on the latent z (e).
  """

  hidden: jax.Array | None = None
  state: jax.Array | None = None
  latent: jax.Array | None = None


def _masked(value, mask):
  return value if mask is None else value * mask


# The index of z in what one layer's forward step keeps: (h, act, c, π, a, r, z, latent).
_Z = 6


def _forward_scan(params, inputs, carry, masks, steps, dtypes, unroll, caps, alignment):
  """The top layer's outputs h^(L)_1..T, the final carry, and per layer and
  step h_t and what `adapted_step` keeps for the backward pass."""
  weights = [step_weights(p, dtype, alignment) for p, dtype in zip(params, dtypes)]

  def step(carry, xs):
    x, valid = xs
    context, new_carry, saved = carry[-1][0][1], [], []
    for layer, (layer_params, (latent, c, h), mask) in enumerate(zip(params, carry, masks)):
      if layer > 0:
        x = _masked(x, mask.hidden)
      layer_carry, layer_saved = adapted_step(
        layer_params,
        weights[layer],
        x,
        _masked(h, mask.state),
        c,
        latent,
        (context,),
        mask.latent,
        dtype=dtypes[layer],
        cap_input_gate=caps[layer],
      )
      context, x = layer_carry[0][1], layer_carry[2]
      new_carry.append(layer_carry)
      saved.append((own(valid, x), *layer_saved))
    return held(valid, tuple(new_carry), carry), saved

  new_carry, saved = jax.lax.scan(step, carry, (inputs, steps), unroll=unroll)
  return saved[-1][0], new_carry, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _recurrence(params, inputs, carry, masks, steps, dtypes, unroll, caps, alignment):
  hs, new_carry, _ = _forward_scan(
    params, inputs, carry, masks, steps, dtypes, unroll, caps, alignment
  )
  return hs, new_carry


def _recurrence_fwd(params, inputs, carry, masks, steps, dtypes, unroll, caps, alignment):
  hs, new_carry, saved = _forward_scan(
    params, inputs, carry, masks, steps, dtypes, unroll, caps, alignment
  )
  return (hs, new_carry), (params, inputs, carry, masks, steps, saved)


def _layer_windows(params, inputs, carry, masks, saved, caps):
  """Per layer, over all steps: its input x^(l), h^(l)_{t-1} under its
  state mask, the context z^(l-1)_t, and its `step_factors`."""
  windows = []
  for layer, (layer_params, (latent0, c0, h0), mask) in enumerate(zip(params, carry, masks)):
    hs, *layer_saved = saved[layer]
    if layer == 0:
      x, context = inputs, shifted(carry[-1][0][1], saved[-1][_Z])
    else:
      x, context = _masked(saved[layer - 1][0], mask.hidden), saved[layer - 1][_Z]
    windows.append(
      (
        x,
        _masked(shifted(h0, hs), mask.state),
        context,
        step_factors(layer_params, layer_saved, c0, latent0, caps[layer]),
      )
    )
  return windows


def _recurrence_bwd(dtypes, unroll, caps, alignment, residuals, cotangents):
  params, inputs, carry, masks, steps, saved = residuals
  d_hs, d_carry_last = cotangents
  windows = _layer_windows(params, inputs, carry, masks, saved, caps)
  weights_t = [transposed_weights(p, dtype, alignment) for p, dtype in zip(params, dtypes)]

  def step(d_carry, xs):
    d_out, layer_xs, valid = xs
    new_d_carry, products = list(d_carry), [None] * len(params)
    d_h_above, d_context = own(valid, d_out), None
    for layer in reversed(range(len(params))):
      (d_c_z, d_z), d_c, d_h_next = d_carry[layer]
      x, h_in, _, factors = layer_xs[layer]
      if d_context is not None:  # layer l+1 read z^(l)_t
        d_z = (d_z + d_context).astype(d_z.dtype)
      mask = masks[layer]
      d_c, d_latent, d_x, d_h_in, d_context, products[layer] = adapted_step_backward(
        params[layer],
        weights_t[layer],
        d_h_above + d_h_next,
        d_c,
        (d_c_z, d_z),
        x,
        h_in,
        factors,
        mask.latent,
        dtype=dtypes[layer],
      )
      new_d_carry[layer] = (d_latent, d_c, _masked(d_h_in, mask.state).astype(d_h_next.dtype))
      d_h_above = d_x if layer == 0 else _masked(d_x, mask.hidden).astype(d_x.dtype)
    # The first layer read the top latent's z of the step before.
    (d_c_z, d_z), d_c, d_h = new_d_carry[-1]
    new_d_carry[-1] = ((d_c_z, (d_z + d_context).astype(d_z.dtype)), d_c, d_h)
    return held(valid, tuple(new_d_carry), d_carry), own(valid, (d_h_above, products))

  layer_xs = [(x, h_in, (), factors) for x, h_in, _, factors in windows]
  d_carry0, (d_inputs, products) = jax.lax.scan(
    step, d_carry_last, (d_hs, layer_xs, steps), reverse=True, unroll=unroll
  )
  grads = []
  for layer, (x, h_in, context, _) in enumerate(windows):
    latent0 = carry[layer][0]
    _, _, _, pis, _, _, zs, _ = saved[layer]
    grads.append(
      weight_gradients(
        params[layer],
        x,
        h_in,
        pis,
        zs,
        *products[layer],
        shifted(latent0[1], zs),
        dtypes[layer],
        context=context,
      )
    )
  return tuple(grads), d_inputs, d_carry0, jax.tree.map(jnp.zeros_like, masks), None


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def _check_layers(inputs, params, carry, masks) -> None:
  """Raises ValueError unless there is one carry (and one `LayerMasks`, if
  any) per layer of parameters, and `inputs` (T, B, m) fit the first layer."""
  layers = len(params)
  if len(carry) != layers or (masks is not None and len(masks) != layers):
    raise ValueError(
      f'lstm_rhn_recurrence: {layers} layers of parameters, but {len(carry)} '
      f'carries and {"no" if masks is None else len(masks)} masks: give one each'
    )
  kernel = params[0]['input']['kernel_1']
  if inputs.ndim != 3 or kernel.shape[0] != inputs.shape[-1]:
    raise ValueError(
      f"inputs {inputs.shape} do not fit the first layer's input kernel "
      f'{kernel.shape}: expected (T, B, {kernel.shape[0]})'
    )


def _constant_masks(masks, layers, dtype):
  """Each layer's `LayerMasks` (none given: no masks) as arrays of `dtype`
  that no gradient flows to."""
  masks = tuple(LayerMasks() for _ in range(layers)) if masks is None else tuple(masks)
  return jax.lax.stop_gradient(
    tuple(
      LayerMasks(*(None if mask is None else jnp.asarray(mask, dtype) for mask in layer))
      for layer in masks
    )
  )


def lstm_rhn_recurrence(
  inputs: jax.Array,
  params: Sequence[Any],
  carry: Sequence[Any],
  masks: Sequence[LayerMasks] | None = None,
  dtypes: Sequence[Any] | None = None,
  unroll: int = 1,
  cap_input_gates: Sequence[bool] | None = None,
  steps: jax.Array | None = None,
):
  """The LSTM-RHN stack over a window, differentiated by the backward pass above.

  Args:
    inputs: x_1..x_T of the first layer, (T, B, m).
    params: each layer's `ALSTMCell` parameters (latent `LSTMCell`), bottom first.
    carry: each layer's (latent carry (c_z, z), c_0, h_0), as
      `LSTMRHNStack.initialize_carry` makes them.
    masks: each layer's `LayerMasks` (None: no dropout). They are constants
      of the window: no gradient flows to them.
    dtypes: each layer's products' operand dtype (None: the inputs'); bfloat16
      sums in float32 (`products.contract`), gates and states stay float32.
    unroll: scan steps per loop iteration, forward and backward.
    cap_input_gates: each layer's capped input gate (None: none capped).
    steps: (T,) bool, the window's own steps (`lm_zoo.cells.held_steps`).

  Returns:
    (each layer's final carry, the top layer's outputs h_1..h_T (T, B, n_L)).
  """
  _check_layers(inputs, params, carry, masks)
  layers = len(params)
  masks = _constant_masks(masks, layers, inputs.dtype)
  dtypes = tuple(product_dtype(dtype, inputs.dtype) for dtype in (dtypes or (None,) * layers))
  caps = tuple(bool(cap) for cap in (cap_input_gates or (False,) * layers))
  carry = tuple(((latent[0], latent[1]), c, h) for latent, c, h in carry)
  hs, new_carry = _recurrence(
    tuple(params),
    inputs,
    carry,
    masks,
    check_steps(steps, inputs.shape[0]),
    dtypes,
    unroll,
    caps,
    contraction_alignment(),
  )
  return new_carry, hs
