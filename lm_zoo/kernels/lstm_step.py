"""One LSTM time step as one Pallas kernel, forward and backward.

The forward kernel computes, for a tile of batch rows and a tile of units,

    G_g = P_g + (m ⊙ h_{t-1}) U_g          for each gate g in (i, f, j, o)
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),  h_t = σ(o) ⊙ tanh(c_t)

(σ(i) capped at 1 - σ(f) with `cap_input_gate`): the recurrent product, the
gate nonlinearities and the cell update in one launch, where XLA runs a
product and several elementwise kernels. Its grid covers (batch tiles, unit
tiles); each program reads the whole of what the gates read for its rows
and the four gates' columns of U for its units, in chunks along the summed
axis. What the gates read is h_{t-1} (K = N) or, for a cell that mixes its
inputs first (the Mogrifier), the mixed [x; h] with U = [W; U] (K = m + n).

The backward kernel takes one step back: from dL/dh_t (the output's gradient
plus the recurrent one, which it masks) and dL/dc_t it forms the gates'
gradients dG_g = s_g ⊙ (dc or dh) from the factors s_g that the caller
computed for every step at once, writes its own tile of them, and sums
dL/d(what the gates read) = Σ_g dG_g U_gᵀ for its tile of that; each
program forms the gates' gradients of all units it sums over (cheap
elementwise work, repeated per tile, so that no program waits for another).

Layouts are gate-major: projections, activations and gate gradients
(4, B, N), the kernel (4, K, N) as [gate, summed unit, output unit]. B, K
and N must be multiples of the tiles (`Tiles`); the windows pad them so.
Block shapes are powers of two, as the Triton backend wants; on a CPU the
kernels run in Pallas' interpret mode (the tests' way of checking their
arithmetic without a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from lm_zoo.kernels.common import (
  compiler_params,
  gate_update,
  precision_for,
  product,
  resolve_interpret,
)

GATES = 4


@dataclasses.dataclass(frozen=True)
class Tiles:
  """The kernels' tiling.

  Attributes:
    batch: rows per program (a power of two, at least 16: the matrix units'
      smallest product).
    units: units per program (a power of two).
    chunk: the summed axis's chunk per product (a power of two).
    num_warps: warps per program on a GPU (Triton).
  """

  batch: int = 16
  units: int = 32
  chunk: int = 32
  num_warps: int = 4

  def __post_init__(self):
    for name in ('batch', 'units', 'chunk'):
      value = getattr(self, name)
      if value < 1 or value & (value - 1):
        raise ValueError(f'Tiles.{name} must be a power of two, got {value}')
    if self.batch < 16:
      raise ValueError(f'Tiles.batch must be at least 16, got {self.batch}')

  @property
  def unit_multiple(self) -> int:
    """N must be a multiple of this."""
    return max(self.units, self.chunk)


def row_tiles(tiles: Tiles) -> Tiles:
  """`tiles` for a kernel whose programs own whole rows (the Mogrifier's
  rounds, the aLSTM's step): 16 rows a program, the fewest a Triton product
  takes, so that a batch of 64 runs as 4 programs on 4 of the GPU's
  multiprocessors rather than one. The windows pad the batch to
  `tiles.batch`, a multiple of 16."""
  return dataclasses.replace(tiles, batch=16)


def tiles_for(batch: int, units: int) -> Tiles:
  """Tiles for a (batch, units) step: every row of a batch of up to 64 in one
  program (the recurrent weights then stream from memory once a step), the
  units split into tiles of 32 (16 for small layers), chunks of 64."""
  rows = 16
  while rows < min(batch, 64):
    rows *= 2
  return Tiles(batch=rows, units=32 if units >= 256 else 16, chunk=64 if units >= 256 else 16)


def _forward_kernel(*refs, chunks, chunk, dtype, precision, cap_input_gate, masked):
  if masked:
    h_ref, mask_ref, c_ref, p_ref, u_ref, c_out, h_out, act_out = refs
  else:
    (h_ref, c_ref, p_ref, u_ref, c_out, h_out, act_out), mask_ref = refs, None

  def accumulate(k, gates):
    cols = pl.ds(pl.multiple_of(k * chunk, chunk), chunk)
    h = h_ref[:, cols] if mask_ref is None else h_ref[:, cols] * mask_ref[:, cols]
    return tuple(
      g + product(h, u_ref[gate, cols, :], dtype, precision) for gate, g in enumerate(gates)
    )

  gates = jax.lax.fori_loop(
    0, chunks, accumulate, tuple(p_ref[gate].astype(jnp.float32) for gate in range(GATES))
  )
  acts, c, h = gate_update(gates, c_ref[...].astype(jnp.float32), cap_input_gate)
  c_out[...] = c.astype(c_out.dtype)
  h_out[...] = h.astype(h_out.dtype)
  for gate, act in enumerate(acts):
    act_out[gate] = act.astype(act_out.dtype)


def forward_step(
  h: jax.Array,
  mask: jax.Array | None,
  c: jax.Array,
  projected: jax.Array,
  kernel: jax.Array,
  *,
  tiles: Tiles,
  dtype: Any,
  cap_input_gate: bool,
  interpret: bool | None = None,
):
  """One step: (c_t, h_t, activations (4, B, N): σ(i), σ(f), tanh(j), σ(o)).

  Args:
    h, mask: what the gates read, (B, K): h_{t-1} and its mask (None: no
      mask), or for a cell that mixes its inputs first, the mixed [x; h].
    c: c_{t-1}, (B, N).
    projected: P = W x_t + b, (4, B, N).
    kernel: U, (4, K, N).
    tiles: the tiling; B, K and N multiples of its batch and `unit_multiple`.
    dtype: the product's operand dtype (bfloat16 sums in float32).
    cap_input_gate: write with min(1 - σ(f), σ(i)) (the activations keep σ(i)).
    interpret: run in Pallas' interpreter (default: off a GPU).
  """
  batch, summed = h.shape
  units = c.shape[-1]
  _check_shapes(batch, (summed, units), tiles)
  interpret = resolve_interpret(interpret)
  rows = pl.BlockSpec((tiles.batch, summed), lambda b, u: (b, 0))
  tile = pl.BlockSpec((tiles.batch, tiles.units), lambda b, u: (b, u))
  gate_tile = pl.BlockSpec((GATES, tiles.batch, tiles.units), lambda b, u: (0, b, u))
  kernel_spec = pl.BlockSpec((GATES, summed, tiles.units), lambda b, u: (0, 0, u))
  body = functools.partial(
    _forward_kernel,
    chunks=summed // tiles.chunk,
    chunk=tiles.chunk,
    dtype=dtype,
    precision=precision_for(dtype),
    cap_input_gate=cap_input_gate,
    masked=mask is not None,
  )
  masks = [] if mask is None else [mask]
  return pl.pallas_call(
    body,
    grid=(batch // tiles.batch, units // tiles.units),
    in_specs=[rows, *[rows] * len(masks), tile, gate_tile, kernel_spec],
    out_specs=[tile, tile, gate_tile],
    out_shape=[
      jax.ShapeDtypeStruct(c.shape, c.dtype),
      jax.ShapeDtypeStruct(c.shape, h.dtype),
      jax.ShapeDtypeStruct(projected.shape, jnp.float32),
    ],
    compiler_params=compiler_params(tiles, interpret),
    interpret=interpret,
    name='lstm_step_forward',
  )(h, *masks, c, projected, kernel)


def _gate_gradients(d_out_ref, d_rec_ref, mask_ref, d_c_ref, d_c_from_h_ref, scale_ref, cols):
  """(dL/dc_t, the four dL/dG_g) at columns `cols` of full-width rows."""
  d_h = d_out_ref[:, cols] + d_rec_ref[:, cols] * mask_ref[:, cols]
  d_c = d_c_ref[:, cols] + d_h * d_c_from_h_ref[:, cols]
  return d_c, tuple(scale_ref[gate, :, cols] * (d_h if gate == 3 else d_c) for gate in range(GATES))


def _backward_kernel(
  d_out_ref,
  d_rec_ref,
  mask_ref,
  d_c_ref,
  d_c_from_h_ref,
  scale_ref,
  f_ref,
  u_ref,
  d_c_out,
  d_in_out,
  d_gates_out,
  *,
  chunks,
  chunk,
  units,
  summed_tiles,
  unit_tiles,
  dtype,
  precision,
):
  refs = (d_out_ref, d_rec_ref, mask_ref, d_c_ref, d_c_from_h_ref, scale_ref)
  tile = pl.program_id(1)

  @pl.when(tile < summed_tiles)
  def _():
    def accumulate(k, total):
      cols = pl.ds(pl.multiple_of(k * chunk, chunk), chunk)
      _, d_gates = _gate_gradients(*refs, cols)
      for gate, d_gate in enumerate(d_gates):
        total = total + product(d_gate, u_ref[gate, :, cols], dtype, precision, transpose_b=True)
      return total

    d_in_out[...] = jax.lax.fori_loop(0, chunks, accumulate, jnp.zeros(d_in_out.shape, jnp.float32))

  @pl.when(tile < unit_tiles)
  def _():
    own = pl.ds(pl.multiple_of(tile * units, units), units)
    d_c, d_gates = _gate_gradients(*refs, own)
    d_c_out[...] = d_c * f_ref[...]
    for gate, d_gate in enumerate(d_gates):
      d_gates_out[gate] = d_gate


def _backward_specs(tiles: Tiles, units: int, summed_tiles: int, unit_tiles: int):
  """The backward kernel's (in_specs, out_specs): whole rows of what the gates'
  gradients read, and tiles of the outputs and of U's summed axis."""
  # Programs cover the wider of K and N; each index clamps to its own axis.
  last = lambda u, tiles_of: jnp.minimum(u, tiles_of - 1)
  rows = pl.BlockSpec((tiles.batch, units), lambda b, u: (b, 0))
  gate_rows = pl.BlockSpec((GATES, tiles.batch, units), lambda b, u: (0, b, 0))
  tile = pl.BlockSpec((tiles.batch, tiles.units), lambda b, u: (b, last(u, unit_tiles)))
  summed_tile = pl.BlockSpec((tiles.batch, tiles.units), lambda b, u: (b, last(u, summed_tiles)))
  gate_tile = pl.BlockSpec(
    (GATES, tiles.batch, tiles.units), lambda b, u: (0, b, last(u, unit_tiles))
  )
  kernel_spec = pl.BlockSpec(
    (GATES, tiles.units, units), lambda b, u: (0, last(u, summed_tiles), 0)
  )
  in_specs = [rows, rows, rows, rows, rows, gate_rows, tile, kernel_spec]
  return in_specs, [tile, summed_tile, gate_tile]


def backward_step(
  d_out: jax.Array,
  d_rec: jax.Array,
  mask: jax.Array,
  d_c: jax.Array,
  d_c_from_h: jax.Array,
  scales: jax.Array,
  forget: jax.Array,
  kernel: jax.Array,
  *,
  tiles: Tiles,
  dtype: Any,
  interpret: bool | None = None,
):
  """One step back: (dL/dc_{t-1}, dL/d(what the gates read) (B, K),
  dL/dG (4, B, N)).

  Args:
    d_out: dL/dh_t from the step's output (B, N).
    d_rec: dL/d(m ⊙ h_t) from the step after (B, N), which this masks.
    mask: m (B, N).
    d_c: dL/dc_t from the step after (B, N).
    d_c_from_h: dc_t/dh_t's factor σ(o) (1 - tanh²(c_t)) (B, N).
    scales: each gate's derivative factor (4, B, N) (see
      `lm_zoo.cells.lstm_recurrence.gate_factors`).
    forget: σ(f) of this step (B, N).
    kernel: U, (4, K, N).
    tiles, dtype, interpret: as `forward_step`'s.
  """
  batch, units = d_out.shape
  summed = kernel.shape[1]
  _check_shapes(batch, (summed, units), tiles)
  interpret = resolve_interpret(interpret)
  summed_tiles, unit_tiles = summed // tiles.units, units // tiles.units
  in_specs, out_specs = _backward_specs(tiles, units, summed_tiles, unit_tiles)
  body = functools.partial(
    _backward_kernel,
    chunks=units // tiles.chunk,
    chunk=tiles.chunk,
    units=tiles.units,
    summed_tiles=summed_tiles,
    unit_tiles=unit_tiles,
    dtype=dtype,
    precision=precision_for(dtype),
  )
  f32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  return pl.pallas_call(
    body,
    grid=(batch // tiles.batch, max(summed_tiles, unit_tiles)),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=[f32(d_c.shape), f32((batch, summed)), f32(scales.shape)],
    compiler_params=compiler_params(tiles, interpret),
    interpret=interpret,
    name='lstm_step_backward',
  )(d_out, d_rec, mask, d_c, d_c_from_h, scales, forget, kernel)


def _check_shapes(batch: int, widths: tuple[int, ...], tiles: Tiles) -> None:
  if batch % tiles.batch or any(width % tiles.unit_multiple for width in widths):
    shape = ', '.join(map(str, (batch, *widths)))
    raise ValueError(
      f'a step of ({shape}) does not tile by {tiles}: pad the batch '
      f'to a multiple of {tiles.batch} and the widths to one of '
      f'{tiles.unit_multiple}'
    )
