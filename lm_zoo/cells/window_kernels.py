"""Each cell type's window kernels: its parameters, as the cell holds them,
into the hand-written recurrences that run a whole window ('fused' and
'pallas' in `lm_zoo.cells.scans`, which registers them by cell type).

Each takes (cell, params, carry, inputs (T, B, m), state_mask, unroll, steps)
and returns (carry, outputs (T, B, n)), as `scans.FusedKernel` describes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_zoo.cells.alstm import ALSTMCell
from lm_zoo.cells.alstm_recurrence import alstm_recurrence
from lm_zoo.cells.lstm import LSTMCell, gate_bias
from lm_zoo.cells.lstm_recurrence import lstm_recurrence
from lm_zoo.cells.mixed_lstm_recurrence import mixed_lstm_recurrence
from lm_zoo.cells.mogrifier import MogrifierRounds, Mogrify
from lm_zoo.cells.pallas_alstm import pallas_alstm_recurrence
from lm_zoo.cells.pallas_lstm import pallas_lstm_recurrence
from lm_zoo.cells.pallas_mogrifier import pallas_mogrified_lstm_recurrence
from lm_zoo.layers.products import accumulation_dtype, linear


def _projected(cell: LSTMCell, params, inputs: jax.Array) -> jax.Array:
  """W x + b (+ b_h) for every step in one product (on (T·B, m): the 2-d
  product XLA's CPU backend runs fastest, as `project_inputs` does), in the
  gates' dtype."""
  flat = linear(
    inputs.reshape(-1, inputs.shape[-1]), params['input']['kernel'], gate_bias(params), cell.dtype
  )
  projected = flat.reshape(*inputs.shape[:-1], flat.shape[-1])
  return projected.astype(accumulation_dtype(_dtype(cell, projected, params)))


def _dtype(cell: LSTMCell, projected, params):
  return cell.dtype or jnp.result_type(projected, params['recurrent_kernel'])


def lstm_window(
  cell: LSTMCell,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`LSTMCell`'s window: `lstm_recurrence` of W x + b (+ b_h)."""
  projected = _projected(cell, params, inputs)
  return lstm_recurrence(
    projected,
    params['recurrent_kernel'],
    carry,
    state_mask,
    unroll,
    _dtype(cell, projected, params),
    cell.cap_input_gate,
    steps,
  )


def pallas_lstm_window(
  cell: LSTMCell,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`LSTMCell`'s window with a Pallas kernel a step: `pallas_lstm_recurrence`."""
  projected = _projected(cell, params, inputs)
  return pallas_lstm_recurrence(
    projected,
    params['recurrent_kernel'],
    carry,
    state_mask,
    unroll,
    _dtype(cell, projected, params),
    cell.cap_input_gate,
    steps=steps,
  )


def _mogrified_args(cell: Mogrify, params, inputs):
  """The LSTM's W, b (+ b_h), U, the rounds, their parameters and the gates'
  product dtype of a `Mogrify(LSTMCell)`."""
  lstm, inner = cell.cell, params['cell']
  rounds = {name: value for name, value in params.items() if name != 'cell'}
  dtype = lstm.dtype or jnp.result_type(inputs, inner['input']['kernel'])
  return (
    inner['input']['kernel'],
    gate_bias(inner),
    inner['recurrent_kernel'],
    MogrifierRounds(cell.rounds, cell.zigzag, cell.dtype),
    rounds,
    dtype,
  )


def mogrified_lstm_window(
  cell: Mogrify,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`Mogrify(LSTMCell)`'s window: `mixed_lstm_recurrence` with the rounds as
  its mix (`MogrifierRounds`), so that every weight gradient of the layer is
  one matrix product per window."""
  kernel, bias, recurrent_kernel, mix, rounds, dtype = _mogrified_args(cell, params, inputs)
  return mixed_lstm_recurrence(
    inputs,
    kernel,
    bias,
    recurrent_kernel,
    carry,
    mix,
    rounds,
    state_mask,
    dtype,
    unroll,
    cell.cell.cap_input_gate,
    steps,
  )


def pallas_mogrified_lstm_window(
  cell: Mogrify,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`Mogrify(LSTMCell)`'s window with two Pallas kernels a step:
  `pallas_mogrified_lstm_recurrence`."""
  kernel, bias, recurrent_kernel, mix, rounds, dtype = _mogrified_args(cell, params, inputs)
  return pallas_mogrified_lstm_recurrence(
    inputs,
    kernel,
    bias,
    recurrent_kernel,
    carry,
    mix,
    rounds,
    state_mask,
    dtype,
    unroll,
    cell.cell.cap_input_gate,
    steps=steps,
  )


def _alstm_dtype(cell: ALSTMCell, params, inputs):
  return cell.dtype or jnp.result_type(inputs, params['input']['kernel_1'])


def alstm_window(
  cell: ALSTMCell,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`ALSTMCell`'s window: `alstm_recurrence`."""
  return alstm_recurrence(
    inputs,
    params,
    carry,
    state_mask,
    _alstm_dtype(cell, params, inputs),
    unroll,
    cell.cap_input_gate,
    steps,
  )


def pallas_alstm_window(
  cell: ALSTMCell,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`ALSTMCell`'s window with one Pallas kernel a step: `pallas_alstm_recurrence`."""
  return pallas_alstm_recurrence(
    inputs,
    params,
    carry,
    state_mask,
    _alstm_dtype(cell, params, inputs),
    unroll,
    cell.cap_input_gate,
    steps=steps,
  )
