"""An `LSTMCell` layer's window through cuDNN's LSTM (`jax.experimental.rnn`).

cuDNN computes [i, f, g, o] = W_ih x + b_ih + W_hh h + b_hh in the same gate
order as ours (i, f, j, o), so our parameters map onto its packed weights as
W_ih = Wᵀ, W_hh = Uᵀ, b_ih = b and b_hh = b_h (zero for a cell with one
bias). It runs float32 products (TF32 on NVIDIA GPUs unless JAX's matmul
precision is 'highest'), one layer a call, on NVIDIA GPUs; elsewhere the
window runs `jax.experimental.rnn`'s reference scan over the same packed
weights, which is how the mapping is tested without a GPU. A stack of
seeds (`jax.vmap`) runs one call per seed.

The calls are jaxlib's cuDNN custom calls, bound through primitives of our
own whose lowering pins every operand and result to the row-major layout
cuDNN reads and writes. jaxlib's own lowering leaves their layouts free, and
XLA then folds the batch-major swap beside the call into the buffer's
layout: on an H200 (jax 0.11.2) the outputs came back permuted between batch
rows and time steps, only the first and last element of the (batch, time)
grid in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import rnn
from jax.extend.core import Primitive
from jax.extend.mlir import ir
from jax.interpreters import mlir

from lm_zoo.cells.held_steps import check_steps
from lm_zoo.cells.lstm import LSTMCell
from lm_zoo.layers.products import product_dtype

STATE_MASK_REFUSAL = "cuDNN's LSTM cannot mask the fed-back state (model.dropout_state)"


def cudnn_refusal(cell: LSTMCell, state_mask: bool = False) -> str | None:
  """Why cuDNN's LSTM cannot run `cell`'s layer, or None if it can.

  Args:
    cell: the layer's cell.
    state_mask: whether the layer masks the fed-back state (state dropout).
  """
  if cell.cap_input_gate:
    return "cuDNN's LSTM has no capped input gate (model.cap_input_gate)"
  dtype = product_dtype(cell.dtype)
  if dtype is not None and dtype != jnp.float32:
    return f"cuDNN's LSTM runs float32 products only, not {dtype.name} (model.dtype)"
  if state_mask:
    return STATE_MASK_REFUSAL
  return None


def pack_weights(params) -> jax.Array:
  """cuDNN's flat weights of one layer from an `LSTMCell`'s parameters."""
  kernel, bias = params['input']['kernel'], params['input']['bias']
  recurrent_bias = params.get('recurrent_bias', jnp.zeros_like(bias))
  return jnp.concatenate(
    [kernel.T.ravel(), params['recurrent_kernel'].T.ravel(), bias, recurrent_bias]
  ).astype(jnp.float32)


def _reference(x, h0, c0, weights, lengths, input_size, hidden_size):
  """`jax.experimental.rnn.lstm`'s reference scan on its packed weights."""
  unpacked = rnn.unpack_lstm_weights(weights, input_size, hidden_size, 1, False)
  return rnn.lstm_ref(x, h0, c0, *unpacked, lengths, input_size, hidden_size, 1, 0.0, False)


def row_major_layouts(types) -> ir.ArrayAttr:
  """A custom call's `operand_layouts` or `result_layouts`: row-major (the
  last axis fastest) for each MLIR tensor type of `types`."""
  return ir.ArrayAttr.get(
    [
      ir.DenseIntElementsAttr.get(
        np.arange(ir.RankedTensorType(t).rank - 1, -1, -1, dtype=np.int64), type=ir.IndexType.get()
      )
      for t in types
    ]
  )


def pin_row_major(lowering):
  """`lowering`, a rule that emits one custom call, with every operand and
  result of that call pinned to the row-major layout."""

  def rule(ctx, *args, **params):
    results = lowering(ctx, *args, **params)
    call = results[0].owner
    call = getattr(call, 'operation', call)
    call.attributes['operand_layouts'] = row_major_layouts(v.type for v in call.operands)
    call.attributes['result_layouts'] = row_major_layouts(v.type for v in call.results)
    return results

  return rule


@functools.cache
def _compiled_bind(primitive, params: tuple):
  return jax.jit(functools.partial(primitive.bind, **dict(params)))


def _primitive(name: str, abstract_eval, cuda_lowering) -> Primitive:
  """A primitive of jax.experimental.rnn's signature whose CUDA lowering is
  jaxlib's with the layouts pinned; run eagerly, it is compiled once per
  set of parameters."""
  primitive = Primitive(name)
  primitive.multiple_results = True
  primitive.def_abstract_eval(abstract_eval)
  primitive.def_impl(
    lambda *args, **params: _compiled_bind(primitive, tuple(sorted(params.items())))(*args)
  )
  if cuda_lowering is not None:
    mlir.register_lowering(primitive, pin_row_major(cuda_lowering), platform='cuda')
  return primitive


_gpu_rnn = getattr(rnn, 'gpu_rnn', None)
_forward_p = _primitive(
  'lm_zoo_cudnn_lstm_fwd', rnn.rnn_abstract_eval, getattr(_gpu_rnn, 'cudnn_rnn_lowering', None)
)
_backward_p = _primitive(
  'lm_zoo_cudnn_lstm_bwd',
  rnn.rnn_bwd_abstract_eval,
  getattr(_gpu_rnn, 'cudnn_rnn_bwd_lowering', None),
)


def _call_params(input_size: int, hidden_size: int) -> dict:
  # TF32 products unless JAX's matmul precision is 'highest', as
  # jax.experimental.rnn.lstm decides.
  return dict(
    input_size=input_size,
    hidden_size=hidden_size,
    num_layers=1,
    dropout=0.0,
    bidirectional=False,
    cudnn_allow_tf32=rnn._lstm_cudnn_allow_tf32(None),
  )


def _forward(input_size, hidden_size, x, h0, c0, weights, lengths):
  """((y, h_n, c_n), residuals) of one layer: cuDNN's on a GPU, the reference
  scan's elsewhere (its residuals are the inputs)."""
  if jax.default_backend() != 'gpu':
    inputs = (x, h0, c0, weights, lengths)
    return _reference(*inputs, input_size, hidden_size), inputs
  y, h_n, c_n, reserve = _forward_p.bind(
    x, h0, c0, weights, lengths, **_call_params(input_size, hidden_size)
  )
  return (y, h_n, c_n), (x, h0, c0, weights, lengths, y, reserve)


def _backward(input_size, hidden_size, residuals, gradients):
  """(dx, dh_0, dc_0, dweights) of one layer."""
  if jax.default_backend() != 'gpu':
    x, h0, c0, weights, lengths = residuals
    _, vjp = jax.vjp(
      lambda *a: _reference(*a, lengths, input_size, hidden_size), x, h0, c0, weights
    )
    return vjp(gradients)
  x, h0, c0, weights, lengths, y, reserve = residuals
  return tuple(
    _backward_p.bind(
      *gradients, x, h0, c0, weights, y, reserve, lengths, **_call_params(input_size, hidden_size)
    )
  )


# cuDNN's primitives have no batching rule: under `jax.vmap` (a stack of
# seeds) each half runs once per mapped slice, in a loop.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _lstm(input_size, hidden_size, x, h0, c0, weights, lengths):
  forward = functools.partial(_forward, input_size, hidden_size)
  return jax.custom_batching.sequential_vmap(forward)(x, h0, c0, weights, lengths)[0]


def _lstm_fwd(input_size, hidden_size, x, h0, c0, weights, lengths):
  forward = functools.partial(_forward, input_size, hidden_size)
  return jax.custom_batching.sequential_vmap(forward)(x, h0, c0, weights, lengths)


def _lstm_bwd(input_size, hidden_size, residuals, gradients):
  backward = functools.partial(_backward, input_size, hidden_size)
  return (*jax.custom_batching.sequential_vmap(backward)(residuals, gradients), None)


_lstm.defvjp(_lstm_fwd, _lstm_bwd)


def check_window(cell: LSTMCell, params, carry, inputs: jax.Array) -> None:
  """Raises ValueError unless the inputs, the parameters and the carry fit one
  layer of `cell`: cuDNN reads its flat weights by the sizes it is given, so
  inputs of another width would read the wrong weights, silently."""
  if jnp.ndim(inputs) != 3:
    raise ValueError(f"scan='cudnn': inputs must be (T, B, m), time first, got {jnp.shape(inputs)}")
  _, batch, m = inputs.shape
  n = cell.features
  c0, h0 = carry
  shapes = {
    "params['input']['kernel']": (params['input']['kernel'], (m, 4 * n)),
    "params['recurrent_kernel']": (params['recurrent_kernel'], (n, 4 * n)),
    "the carry's c": (c0, (batch, n)),
    "the carry's h": (h0, (batch, n)),
  }
  for name, (array, want) in shapes.items():
    if jnp.shape(array) != want:
      raise ValueError(
        f"scan='cudnn': {name} is {jnp.shape(array)}, but inputs {inputs.shape} and "
        f'LSTMCell({n}) need {want}: give the layer the inputs, carry '
        '(cell.initialize_carry) and parameters of one cell'
      )


def cudnn_lstm_window(
  cell: LSTMCell,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`cell`'s layer over a time-major window (T, B, m) in one call of cuDNN's
  LSTM (its reference scan off a GPU); returns ((c_T, h_T), outputs (T, B, n)).
  `steps`, the window's own steps, must come first (`lm_zoo.cells.held_steps`):
  cuDNN runs each row for their count."""
  del unroll  # cuDNN runs the whole window
  reason = cudnn_refusal(cell, state_mask is not None)
  if reason:
    raise ValueError(f"scan='cudnn' cannot run this layer: {reason}")
  check_window(cell, params, carry, inputs)
  steps = check_steps(steps, inputs.shape[0])
  c0, h0 = carry
  _, batch, size = inputs.shape
  x = jnp.swapaxes(inputs, 0, 1).astype(jnp.float32)  # cuDNN's calls are batch-major
  own_steps = inputs.shape[0] if steps is None else jnp.sum(steps, dtype=jnp.int32)
  lengths = jnp.full((batch,), own_steps, jnp.int32)
  ys, h_n, c_n = _lstm(
    size,
    cell.features,
    x,
    h0[None].astype(jnp.float32),
    c0[None].astype(jnp.float32),
    pack_weights(params),
    lengths,
  )
  return (
    (c_n[0].astype(c0.dtype), h_n[0].astype(h0.dtype)),
    jnp.swapaxes(ys, 0, 1).astype(h0.dtype),
  )
