"""How each cell type can run a window of time steps, and the one switch that
picks among them (in the style of recurrentgemma's `ScanType`).

`lm_zoo.models.RecurrentLayer` runs a cell over a time-major window in one of
the ways of `SCANS`:

- 'scan': `lax.scan` over `cell(carry, x)`, differentiated by JAX; any cell.
- 'remat': the same scan with each step recomputed in the backward pass from
  its input and carry (`nn.remat`), the only per-step values kept: memory
  for long windows, for a second forward pass (W x stays inside the scan).
  Any cell; it is a scan of its own rather than a flag on the others because
  the hoisted and fused paths keep per-step values that it exists to drop.
- 'hoisted': W x + b for every step as one matrix product before the scan,
  which then runs only the recurrent part; cell types registered with
  `project` and `step`.
- 'fused': a kernel that runs the whole window with a hand-written backward
  pass whose weight gradients are one matrix product per window; cell types
  registered with `fused`.
- 'auto': 'fused' where the cell has a kernel, else 'hoisted' where it can
  hoist, else 'scan'.

All of them give the same outputs and gradients, to rounding. The fused
kernels are `jax.custom_vjp`s: reverse mode only (for `jax.jvp`, choose
another). `resolve_scan` refuses a way a cell cannot take, naming the ways
it can.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.base import describe
from lm_zoo.cells.lstm import LSTMCell, gate_bias
from lm_zoo.cells.lstm_recurrence import lstm_recurrence, mixed_lstm_recurrence
from lm_zoo.cells.mogrifier import Mogrify, MogrifierRounds
from lm_zoo.layers.products import accumulation_dtype, linear

SCANS = ('auto', 'scan', 'hoisted', 'fused', 'remat')

# kernel(cell, params, carry, inputs (T, B, m), state_mask, unroll) -> (carry, outputs
# (T, B, n)): a window from the cell's settings and its parameters, given explicitly.
FusedKernel = Callable[[nn.Module, Any, Any, jax.Array, 'jax.Array | None', int],
                       tuple[Any, jax.Array]]


@dataclasses.dataclass(frozen=True)
class CellScans:
  """What a cell type can run besides 'scan' and 'remat'.

  Attributes:
    project: `project(cell, xs)`: W x + b for inputs of any leading shape.
    step: `step(cell, carry, projected) -> (carry, y)`: one step from W x + b.
      With `project`, the cell hoists.
    fused: `fused(cell)`: the `FusedKernel` for this cell, or None (a
      wrapper's kernel depends on the cell it wraps).
  """

  project: Callable[..., jax.Array] | None = None
  step: Callable[..., Any] | None = None
  fused: Callable[[nn.Module], FusedKernel | None] | None = None


def lstm_window(cell: LSTMCell, params, carry, inputs: jax.Array,
                state_mask: jax.Array | None = None, unroll: int = 1):
  """`LSTMCell`'s window: `lstm_recurrence` of W x + b (+ b_h), computed for
  every step in one product (on (T·B, m): the 2-d product XLA's CPU backend
  runs fastest, as `project_inputs` does)."""
  flat = linear(inputs.reshape(-1, inputs.shape[-1]), params['input']['kernel'],
                gate_bias(params), cell.dtype)
  projected = flat.reshape(*inputs.shape[:-1], flat.shape[-1])
  dtype = cell.dtype or jnp.result_type(projected, params['recurrent_kernel'])
  return lstm_recurrence(projected.astype(accumulation_dtype(dtype)), params['recurrent_kernel'],
                         carry, state_mask, unroll, dtype, cell.cap_input_gate)


def mogrified_lstm_window(cell: Mogrify, params, carry, inputs: jax.Array,
                          state_mask: jax.Array | None = None, unroll: int = 1):
  """`Mogrify(LSTMCell)`'s window: `mixed_lstm_recurrence` with the rounds as
  its mix (`MogrifierRounds`), so that every weight gradient of the layer is
  one matrix product per window."""
  lstm, inner = cell.cell, params['cell']
  rounds = {name: value for name, value in params.items() if name != 'cell'}
  dtype = lstm.dtype or jnp.result_type(inputs, inner['input']['kernel'])
  return mixed_lstm_recurrence(inputs, inner['input']['kernel'], gate_bias(inner),
                               inner['recurrent_kernel'], carry,
                               MogrifierRounds(cell.rounds, cell.zigzag, cell.dtype), rounds,
                               state_mask, dtype, unroll, lstm.cap_input_gate)


def _inner_window(kernel: FusedKernel, cell: Mogrify, params, *args):
  """A zero-round `Mogrify`'s window: its inner cell's."""
  return kernel(cell.cell, params['cell'], *args)


def _mogrify_kernel(cell: Mogrify) -> FusedKernel | None:
  if cell.rounds == 0:
    inner = fused_kernel(cell.cell)
    return None if inner is None else functools.partial(_inner_window, inner)
  return mogrified_lstm_window if type(cell.cell) is LSTMCell else None


# Cell type (exactly: a subclass may change the step) -> what it can run.
REGISTRY: dict[type, CellScans] = {
    LSTMCell: CellScans(project=LSTMCell.project_inputs, step=LSTMCell.step_projected,
                        fused=lambda cell: lstm_window),
    Mogrify: CellScans(fused=_mogrify_kernel),
}


def register_scans(cell_type: type, scans: CellScans) -> None:
  """Declares what cells of `cell_type` can run (see `CellScans`)."""
  if (scans.project is None) != (scans.step is None):
    raise ValueError(f'{cell_type.__name__} hoists with both project and step: give both '
                     'or neither')
  REGISTRY[cell_type] = scans


def cell_scans(cell: nn.Module) -> CellScans:
  """What `cell`'s type registered; nothing beyond 'scan' and 'remat' if none."""
  return REGISTRY.get(type(cell), CellScans())


def fused_kernel(cell: nn.Module) -> FusedKernel | None:
  """`cell`'s fused window kernel, or None."""
  fused = cell_scans(cell).fused
  return None if fused is None else fused(cell)


def resolve_scan(cell: nn.Module, scan: str) -> str:
  """The way to run `cell` that `scan` (one of `SCANS`) asks for, with
  'auto' decided.

  Raises:
    ValueError: `scan` is unknown, or `cell` cannot run so: one line naming
      the cell and the ways it can run.
  """
  if scan not in SCANS:
    raise ValueError(f'scan={scan!r} is not known: choose one of {", ".join(SCANS)}')
  can = {'fused': fused_kernel(cell) is not None,
         'hoisted': cell_scans(cell).project is not None, 'scan': True, 'remat': True}
  if scan == 'auto':
    return next(way for way in ('fused', 'hoisted', 'scan') if can[way])
  if not can[scan]:
    ways = ', '.join(repr(way) for way in SCANS if way == 'auto' or can[way])
    raise ValueError(f'scan={scan!r} cannot run {describe(cell)}: choose one of {ways}')
  return scan
