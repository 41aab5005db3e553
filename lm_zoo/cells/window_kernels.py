"""Each cell type's window kernels: its parameters, as the cell holds them,
into the hand-written recurrences that run a whole window ('fused',
'pallas' and 'persistent' in `lm_zoo.cells.scans`, which registers them by
cell type).

Each takes (cell, params, carry, inputs (T, B, m), state_mask, unroll, steps)
and returns (carry, outputs (T, B, n)), as `scans.FusedKernel` describes. A
cell type's 'fused' and 'pallas' windows read its parameters the same way and
differ only in the recurrence they call.
"""

from __future__ import annotations

from typing import Callable

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
from lm_zoo.layers.products import accumulation_dtype, linear, product_dtype


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


def _named(window, name: str, doc: str):
  """`window` as the module's public function `name`, for tracebacks and the API docs."""
  window.__name__ = window.__qualname__ = name
  window.__doc__ = doc
  return window


def _lstm_window(recurrence: Callable, name: str, doc: str):
  """`LSTMCell`'s window through `recurrence` (`lstm_recurrence`'s arguments)."""

  def window(cell: LSTMCell, params, carry, inputs, state_mask=None, unroll=1, steps=None):
    projected = _projected(cell, params, inputs)
    dtype = _dtype(cell, projected, params)
    kernel = params['recurrent_kernel']
    return recurrence(
      projected, kernel, carry, state_mask, unroll, dtype, cell.cap_input_gate, steps=steps
    )

  return _named(window, name, doc)


lstm_window = _lstm_window(
  lstm_recurrence, 'lstm_window', """`LSTMCell`'s window: `lstm_recurrence` of W x + b (+ b_h)."""
)
pallas_lstm_window = _lstm_window(
  pallas_lstm_recurrence,
  'pallas_lstm_window',
  """`LSTMCell`'s window with a Pallas kernel a step: `pallas_lstm_recurrence`.""",
)


def persistent_refusal(cell: LSTMCell) -> str | None:
  """Why the persistent kernels cannot run `cell`'s layer (they multiply in
  bfloat16 only), or None if they can."""
  dtype = product_dtype(cell.dtype)
  if dtype == jnp.bfloat16:
    return None
  # model.dtype=float32 leaves the cell's dtype unset: the inputs'.
  name = "the inputs' dtype (model.dtype=float32)" if dtype is None else dtype.name
  return (
    f'the persistent kernels multiply in bfloat16 only, not {name}: '
    "set model.dtype=bfloat16 (the cell's dtype)"
  )


HELD_STEPS_REFUSAL = (
  "scan='persistent' cannot hold the state past a window's own steps (steps: variable "
  "windows padded, data.pad_windows_to): leave data.pad_windows_to unset or run scan='fused'"
)


def check_persistent_window(inputs: jax.Array, steps) -> None:
  """Refuses what only a window tells the persistent kernels cannot run:
  held steps, a batch above their 64 rows."""
  from lm_zoo.kernels.persistent_lstm import ROWS

  if steps is not None:
    raise ValueError(HELD_STEPS_REFUSAL)
  if inputs.shape[1] > ROWS:
    raise ValueError(
      f"scan='persistent' runs at most {ROWS} rows a window (one warpgroup), got batch "
      f"{inputs.shape[1]}: set data.batch_size <= {ROWS} or run scan='fused'"
    )


def persistent_lstm_window(
  cell: LSTMCell, params, carry, inputs, state_mask=None, unroll=1, steps=None
):
  """`LSTMCell`'s window with both passes as persistent Mosaic GPU kernels:
  `persistent_lstm_recurrence` of W x + b (+ b_h), one launch a window each
  way on a GPU, a launch a step interpreted elsewhere (`where_it_runs`).
  `unroll` does not apply; the cell's dtype must be bfloat16
  (`persistent_refusal`)."""
  # Imported here: Mosaic GPU adds a quarter of a second to importing lm_zoo.cells.
  from lm_zoo.cells.persistent_lstm import persistent_lstm_recurrence, where_it_runs

  del unroll  # one launch a window
  check_persistent_window(inputs, steps)
  projected = _projected(cell, params, inputs)
  kernel = params['recurrent_kernel']
  (c, h), hs = persistent_lstm_recurrence(
    projected, kernel, carry, state_mask, cell.cap_input_gate, **where_it_runs()
  )
  # float32 from the kernels: the carry's dtypes, as `lstm_recurrence` returns.
  c0, h0 = carry
  return (c.astype(c0.dtype), h.astype(h0.dtype)), hs.astype(h0.dtype)


def _mogrified_lstm_window(recurrence: Callable, name: str, doc: str):
  """`Mogrify(LSTMCell)`'s window through `recurrence`
  (`mixed_lstm_recurrence`'s arguments): the LSTM's W, b (+ b_h) and U, the
  rounds as the mix and their parameters."""

  def window(cell: Mogrify, params, carry, inputs, state_mask=None, unroll=1, steps=None):
    lstm, inner = cell.cell, params['cell']
    rounds = {key: value for key, value in params.items() if key != 'cell'}
    mix = MogrifierRounds(cell.rounds, cell.zigzag, cell.dtype)
    dtype = lstm.dtype or jnp.result_type(inputs, inner['input']['kernel'])
    weights = (inner['input']['kernel'], gate_bias(inner), inner['recurrent_kernel'])
    mixing = (carry, mix, rounds, state_mask, dtype, unroll, lstm.cap_input_gate)
    return recurrence(inputs, *weights, *mixing, steps=steps)

  return _named(window, name, doc)


mogrified_lstm_window = _mogrified_lstm_window(
  mixed_lstm_recurrence,
  'mogrified_lstm_window',
  """`Mogrify(LSTMCell)`'s window: `mixed_lstm_recurrence` with the rounds as
  its mix (`MogrifierRounds`), so that every weight gradient of the layer is
  one matrix product per window.""",
)
pallas_mogrified_lstm_window = _mogrified_lstm_window(
  pallas_mogrified_lstm_recurrence,
  'pallas_mogrified_lstm_window',
  """`Mogrify(LSTMCell)`'s window with two Pallas kernels a step:
  `pallas_mogrified_lstm_recurrence`.""",
)


def _alstm_window(recurrence: Callable, name: str, doc: str):
  """`ALSTMCell`'s window through `recurrence` (`alstm_recurrence`'s arguments)."""

  def window(cell: ALSTMCell, params, carry, inputs, state_mask=None, unroll=1, steps=None):
    dtype = cell.dtype or jnp.result_type(inputs, params['input']['kernel_1'])
    return recurrence(
      inputs, params, carry, state_mask, dtype, unroll, cell.cap_input_gate, steps=steps
    )

  return _named(window, name, doc)


alstm_window = _alstm_window(
  alstm_recurrence, 'alstm_window', """`ALSTMCell`'s window: `alstm_recurrence`."""
)
pallas_alstm_window = _alstm_window(
  pallas_alstm_recurrence,
  'pallas_alstm_window',
  """`ALSTMCell`'s window with one Pallas kernel a step: `pallas_alstm_recurrence`.""",
)
