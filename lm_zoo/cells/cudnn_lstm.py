"""An `LSTMCell` layer's window through cuDNN's LSTM (`jax.experimental.rnn`).

cuDNN computes [i, f, g, o] = W_ih x + b_ih + W_hh h + b_hh in the same gate
order as ours (i, f, j, o), so our parameters map onto its packed weights as
W_ih = Wᵀ, W_hh = Uᵀ, b_ih = b and b_hh = b_h (zero for a cell with one
bias). It runs float32 products (TF32 on NVIDIA GPUs unless JAX's matmul
precision is 'highest'), one layer a call, on NVIDIA GPUs; elsewhere the
window runs `jax.experimental.rnn`'s reference scan over the same packed
weights, which is how the mapping is tested without a GPU. A stack of
seeds (`jax.vmap`) runs one call per seed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import rnn

from lm_zoo.cells.lstm import LSTMCell


STATE_MASK_REFUSAL = "cuDNN's LSTM cannot mask the fed-back state (model.dropout_state)"


def cudnn_refusal(cell: LSTMCell, state_mask: bool = False) -> str | None:
  """Why cuDNN's LSTM cannot run `cell`'s layer, or None if it can.

  Args:
    cell: the layer's cell.
    state_mask: whether the layer masks the fed-back state (state dropout).
  """
  if cell.cap_input_gate:
    return "cuDNN's LSTM has no capped input gate (model.cap_input_gate)"
  if cell.dtype is not None and jnp.dtype(cell.dtype) != jnp.float32:
    return f"cuDNN's LSTM runs float32 products only, not {jnp.dtype(cell.dtype).name} " \
           '(model.dtype)'
  if state_mask:
    return STATE_MASK_REFUSAL
  return None


def pack_weights(params) -> jax.Array:
  """cuDNN's flat weights of one layer from an `LSTMCell`'s parameters."""
  kernel, bias = params['input']['kernel'], params['input']['bias']
  recurrent_bias = params.get('recurrent_bias', jnp.zeros_like(bias))
  return jnp.concatenate([kernel.T.ravel(), params['recurrent_kernel'].T.ravel(), bias,
                          recurrent_bias]).astype(jnp.float32)


def _reference(x, h0, c0, weights, lengths, input_size, hidden_size):
  """`jax.experimental.rnn.lstm`'s reference scan on its packed weights."""
  unpacked = rnn.unpack_lstm_weights(weights, input_size, hidden_size, 1, False)
  return rnn.lstm_ref(x, h0, c0, *unpacked, lengths, input_size, hidden_size, 1, 0.0, False)


def _forward(input_size, hidden_size, x, h0, c0, weights, lengths):
  """((y, h_n, c_n), residuals) of one layer: cuDNN's on a GPU, the reference
  scan's elsewhere (its residuals are the inputs)."""
  if jax.default_backend() != 'gpu':
    inputs = (x, h0, c0, weights, lengths)
    return _reference(*inputs, input_size, hidden_size), inputs
  return rnn.lstm_fwd(x, h0, c0, weights, lengths, input_size=input_size,
                      hidden_size=hidden_size, num_layers=1, dropout=0.0, bidirectional=False,
                      precision=None)


def _backward(input_size, hidden_size, residuals, gradients):
  """(dx, dh_0, dc_0, dweights) of one layer."""
  if jax.default_backend() != 'gpu':
    x, h0, c0, weights, lengths = residuals
    _, vjp = jax.vjp(lambda *a: _reference(*a, lengths, input_size, hidden_size),
                     x, h0, c0, weights)
    return vjp(gradients)
  return rnn.lstm_bwd(input_size, hidden_size, 1, 0.0, False, None, residuals, gradients)[:4]


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


def cudnn_lstm_window(cell: LSTMCell, params, carry, inputs: jax.Array,
                      state_mask: jax.Array | None = None, unroll: int = 1):
  """`cell`'s layer over a time-major window (T, B, m) in one call of cuDNN's
  LSTM (its reference scan off a GPU); returns ((c_T, h_T), outputs (T, B, n))."""
  del unroll  # cuDNN runs the whole window
  reason = cudnn_refusal(cell, state_mask is not None)
  if reason:
    raise ValueError(f"scan='cudnn' cannot run this layer: {reason}")
  c0, h0 = carry
  steps, batch, size = inputs.shape
  x = jnp.swapaxes(inputs, 0, 1).astype(jnp.float32)  # cuDNN's calls are batch-major
  lengths = jnp.full((batch,), steps, jnp.int32)
  ys, h_n, c_n = _lstm(size, cell.features, x, h0[None].astype(jnp.float32),
                       c0[None].astype(jnp.float32), pack_weights(params), lengths)
  return ((c_n[0].astype(c0.dtype), h_n[0].astype(h0.dtype)),
          jnp.swapaxes(ys, 0, 1).astype(h0.dtype))
