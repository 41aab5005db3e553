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
- 'pallas': the fused window with each time step, forward and back, one
  Pallas kernel (`lm_zoo.kernels`): compiled on a GPU, interpreted (slowly,
  for tests) elsewhere; cell types registered with `pallas`.
- 'cudnn': cuDNN's LSTM through `jax.experimental.rnn` (float32), one layer
  a call; on other backends its reference scan. Plain LSTM layers only: no
  capped gate, no bfloat16 products, no mask on the fed-back state (weight
  drop is applied to the weights before the call, and the second gate bias
  is cuDNN's own b_hh).
- 'persistent': the LSTM's window with each pass, forward and back, ONE
  persistent Mosaic GPU kernel (`lm_zoo.cells.persistent_lstm`; Hopper):
  compiled on a GPU, interpreted a launch a step (exact, slow: for tests)
  elsewhere. `LSTMCell` layers (and a `Mogrify` of no rounds) with bfloat16
  products (model.dtype), a batch of at most 64, the state mask, no held
  steps. A `Mogrify(LSTMCell)` of low-rank rounds runs its forward pass
  and its backward chain as one such kernel each (every round and step;
  `lm_zoo.cells.persistent_mogrifier`), on the same terms.
- 'auto': 'fused' where the cell has a kernel, else 'hoisted' where it can
  hoist, else 'scan', on every backend. 'cudnn' is taken by name only: on an
  H200 its outputs came back permuted (docs/cells.md), and its fix awaits a
  check on a GPU; 'pallas' is slower than 'fused' there; 'persistent' has
  not been run on a GPU yet.

All of them give the same outputs and gradients, to rounding. The fused,
Pallas, cuDNN and persistent windows are `jax.custom_vjp`s: reverse mode
only (for `jax.jvp`, choose another; grad of grad through 'fused' alone).
`resolve_scan` refuses a way a cell cannot
take, naming the reason or the ways it can.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, Callable

import flax.linen as nn
import jax

from lm_zoo.cells.alstm import ALSTMCell, LSTMRHNStack, StaticLatent
from lm_zoo.cells.base import describe
from lm_zoo.cells.cudnn_lstm import STATE_MASK_REFUSAL, cudnn_lstm_window, cudnn_refusal
from lm_zoo.cells.lstm import LSTMCell
from lm_zoo.cells.lstm_rhn_window import STATE_MASK_REFUSAL as LSTM_RHN_STATE_MASK
from lm_zoo.cells.lstm_rhn_window import lstm_rhn_kernel
from lm_zoo.cells.mogrifier import Mogrify
from lm_zoo.cells.persistent_mogrifier import (
  persistent_mogrified_lstm_window,
  persistent_mogrifier_refusal,
)
from lm_zoo.cells.window_kernels import (
  alstm_window,
  lstm_window,
  mogrified_lstm_window,
  pallas_alstm_window,
  pallas_lstm_window,
  pallas_mogrified_lstm_window,
  persistent_lstm_window,
  persistent_refusal,
)


class Scan(enum.StrEnum):
  """The ways of running a window (above); a `Scan` is its string, so
  `scan='fused'` and `scan=Scan.FUSED` are one choice."""

  AUTO = 'auto'
  SCAN = 'scan'
  HOISTED = 'hoisted'
  FUSED = 'fused'
  PALLAS = 'pallas'
  CUDNN = 'cudnn'
  PERSISTENT = 'persistent'
  REMAT = 'remat'


SCANS = tuple(way.value for way in Scan)
# The ways that run a window as one kernel call of the cell's parameters.
WINDOW_KERNELS = tuple(way.value for way in (Scan.FUSED, Scan.PALLAS, Scan.CUDNN, Scan.PERSISTENT))

# kernel(cell, params, carry, inputs (T, B, m), state_mask, unroll, steps) -> (carry,
# outputs (T, B, n)): a window from the cell's settings and its parameters, given
# explicitly; `steps` (T,) bool marks its own steps, first (`lm_zoo.cells.held_steps`).
FusedKernel = Callable[
  [nn.Module, Any, Any, jax.Array, 'jax.Array | None', int, 'jax.Array | None'],
  tuple[Any, jax.Array],
]
# kernels(cell) -> the cell's kernel, or None where this cell (of the registered
# type) has none, or a string: why it cannot run (named in the refusal).
KernelFactory = Callable[[nn.Module], 'FusedKernel | str | None']


@dataclasses.dataclass(frozen=True)
class CellScans:
  """What a cell type can run besides 'scan' and 'remat'.

  Attributes:
    project: `project(cell, xs)`: W x + b for inputs of any leading shape.
    step: `step(cell, carry, projected) -> (carry, y)`: one step from W x + b.
      With `project`, the cell hoists.
    fused, pallas, cudnn, persistent: `KernelFactory`s of the window
      kernels of those names (a wrapper's kernel depends on the cell it wraps).
  """

  project: Callable[..., jax.Array] | None = None
  step: Callable[..., Any] | None = None
  fused: KernelFactory | None = None
  pallas: KernelFactory | None = None
  cudnn: KernelFactory | None = None
  persistent: KernelFactory | None = None


def _inner_window(kernel: FusedKernel, cell: Mogrify, params, *args):
  """A zero-round `Mogrify`'s window: its inner cell's."""
  return kernel(cell.cell, params['cell'], *args)


def _mogrify_kernel(way: str, own: KernelFactory | None = None) -> KernelFactory:
  """A `Mogrify`'s `way` kernel: with no rounds its inner cell's, else
  `own(cell)`'s where it wraps an `LSTMCell`."""

  def kernels(cell: Mogrify):
    if cell.rounds == 0:
      inner = window_kernel(cell.cell, way)
      return inner if not callable(inner) else functools.partial(_inner_window, inner)
    return own(cell) if own is not None and type(cell.cell) is LSTMCell else None

  return kernels


# Why an aLSTM that drops its latent runs no window kernel.
LATENT_DROPOUT_REFUSAL = (
  "dropout_latent draws its mask inside the step (with a 'dropout' "
  "RNG), which the window kernels do not: run scan='scan'"
)


def _drops_latent(cell: ALSTMCell) -> bool:
  """Whether the cell will draw a latent dropout mask: a rate, and a 'dropout'
  RNG where the cell is bound (unbound, it might be given one)."""
  return cell.dropout_latent > 0 and (cell.scope is None or cell.has_rng('dropout'))


def _alstm_kernel(own: FusedKernel) -> KernelFactory:
  """An `ALSTMCell`'s kernel `own` where its latent is `LSTMCell` or
  `StaticLatent` and it drops no latent (evaluation drops none)."""

  def kernels(cell: ALSTMCell):
    if cell.latent not in (LSTMCell, StaticLatent):
      return None
    return LATENT_DROPOUT_REFUSAL if _drops_latent(cell) else own

  return kernels


def _cudnn_kernel(cell: LSTMCell) -> FusedKernel | str:
  return cudnn_refusal(cell) or cudnn_lstm_window


def _persistent_kernel(cell: LSTMCell) -> FusedKernel | str:
  return persistent_refusal(cell) or persistent_lstm_window


def _persistent_mogrify_kernel(cell: Mogrify) -> FusedKernel | str:
  return persistent_mogrifier_refusal(cell) or persistent_mogrified_lstm_window


# Cell type (exactly: a subclass may change the step) -> what it can run.
REGISTRY: dict[type, CellScans] = {
  LSTMCell: CellScans(
    project=LSTMCell.project_inputs,
    step=LSTMCell.step_projected,
    fused=lambda cell: lstm_window,
    pallas=lambda cell: pallas_lstm_window,
    cudnn=_cudnn_kernel,
    persistent=_persistent_kernel,
  ),
  Mogrify: CellScans(
    fused=_mogrify_kernel('fused', lambda cell: mogrified_lstm_window),
    pallas=_mogrify_kernel('pallas', lambda cell: pallas_mogrified_lstm_window),
    cudnn=_mogrify_kernel('cudnn'),
    persistent=_mogrify_kernel('persistent', _persistent_mogrify_kernel),
  ),
  ALSTMCell: CellScans(
    fused=_alstm_kernel(alstm_window), pallas=_alstm_kernel(pallas_alstm_window)
  ),
  LSTMRHNStack: CellScans(fused=lstm_rhn_kernel),
}


def register_scans(cell_type: type, scans: CellScans) -> None:
  """Declares what cells of `cell_type` can run (see `CellScans`)."""
  if not isinstance(cell_type, type):
    raise ValueError(f'cell_type must be a cell class, such as LSTMCell, got {cell_type!r}')
  if not isinstance(scans, CellScans):
    raise ValueError(f'scans must be a CellScans(...), got {type(scans).__name__} {scans!r}')
  if (scans.project is None) != (scans.step is None):
    raise ValueError(
      f'{cell_type.__name__} hoists with both project and step: give both or neither'
    )
  REGISTRY[cell_type] = scans


def cell_scans(cell: nn.Module) -> CellScans:
  """What `cell`'s type registered; nothing beyond 'scan' and 'remat' if none."""
  return REGISTRY.get(type(cell), CellScans())


def window_kernel(cell: nn.Module, way: str) -> FusedKernel | str | None:
  """`cell`'s window kernel for `way` (one of `WINDOW_KERNELS`), None where it
  has none, or why it cannot run one."""
  kernels = getattr(cell_scans(cell), way)
  return None if kernels is None else kernels(cell)


def resolve_scan(cell: nn.Module, scan: str, *, state_mask: bool = False) -> str:
  """The way to run `cell` that `scan` (one of `SCANS`) asks for, with
  'auto' decided for the cell ('fused', else 'hoisted', else 'scan': never
  'cudnn', 'pallas' nor 'persistent', which are taken by name);
  `state_mask`: whether the layer masks its fed-back state (which cuDNN
  cannot). What only the window's inputs tell ('persistent': the batch,
  held steps) is refused when it runs.

  Raises:
    ValueError: `scan` is unknown, `cell` is not a cell instance, or it
      cannot run so: one line naming the reason, or the cell and the ways
      it can run.
  """
  if scan not in SCANS:
    raise ValueError(f'scan={scan!r} is not known: choose one of {", ".join(SCANS)}')
  if not isinstance(cell, nn.Module):  # a class or a name would resolve as an unknown cell
    raise ValueError(f'cell must be a cell instance, such as LSTMCell(n), got {cell!r}')
  if state_mask and isinstance(cell, LSTMRHNStack):
    raise ValueError(LSTM_RHN_STATE_MASK)
  kernels = {way: window_kernel(cell, way) for way in WINDOW_KERNELS}
  if state_mask and callable(kernels['cudnn']):
    kernels['cudnn'] = STATE_MASK_REFUSAL
  can = {way: callable(kernel) for way, kernel in kernels.items()}
  can.update(hoisted=cell_scans(cell).project is not None, scan=True, remat=True)
  if scan == 'auto':
    return next(way for way in ('fused', 'hoisted', 'scan') if can[way])
  if not can[scan]:
    if isinstance(kernels.get(scan), str):
      raise ValueError(f'scan={scan!r} cannot run {describe(cell)}: {kernels[scan]}')
    ways = ', '.join(repr(way) for way in SCANS if way == 'auto' or can[way])
    raise ValueError(f'scan={scan!r} cannot run {describe(cell)}: choose one of {ways}')
  return scan
