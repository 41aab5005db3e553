"""The LSTM recurrence's forward pass over a whole window as ONE persistent
Mosaic GPU kernel (Hopper: TMA copies, wgmma), for a probe of its speed.

Given the hoisted projections P_t = x_t W + b (T, B, 4n), gate order
[i, f, j, o], the recurrent kernel U (n, 4n) and the carry (h_0, c_0), it runs

    [i, f, j, o] = P_t + (m ⊙ h_{t-1}) U
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),   h_t = σ(o) ⊙ tanh(c_t)

(σ(i) capped at 1 - σ(f) with `cap_input_gate`; m a mask on the fed-back
state, (B, n), one for the window: variational dropout) as `lstm_recurrence`
does with ``dtype=jnp.bfloat16``: the product's operands m ⊙ h_{t-1} and U in
bfloat16, summed in float32; P, c and the outputs h_t (unmasked) in float32.

Where XLA launches a few small kernels a step, this launches one for the
window, as FlashRNN's fused kernel, Baidu's persistent RNNs and cuDNN's
persistent algorithm do. The grid has G blocks (one warpgroup each, one per
SM); block g owns u = n_pad / G hidden units, i.e. the four gates' columns of
those units, 4u columns of U, which it copies to shared memory ONCE (the
wrapper re-lays U and P out so that they are contiguous). Each step a block
copies the whole of h_{t-1} (64 rows, n_pad, bfloat16) from global memory to
shared memory by TMA, multiplies it by its U slice on the tensor cores
(wgmma, a (64, 4u) float32 accumulator), adds its slice of P_t, updates its
c (kept in shared memory) and writes its slice of m ⊙ h_t (m's slice copied
to shared memory once) to the bfloat16 history (T, 64, n_pad), which the
next step reads, and of h_t to the float32 outputs. It
then waits for its writes and arrives at the grid's barrier, and before
reading h_t waits there for every block (`grid_barrier`: a global semaphore
and proxy fences). Every step has its own slot of the history, so no block
overwrites what another still reads.

Tiles: batch padded to 64 rows (wgmma's M for one warpgroup; at most 64
rows: 128 would not fit shared memory at the recipes' sizes); both wgmma
operands swizzled by 64 bytes (Mosaic GPU wants the same swizzle for both;
32 bfloat16 columns), so n_pad is a multiple of 32 and u a power of two
from 8 (the accumulator's column tile; `block_width`), u at most 64 (4u =
wgmma's N ≤ 256). At hidden
951, batch 64: n_pad 960, G = 120 blocks of u = 8 units (an H100 has 132
SMs, all blocks must be resident at once), shared memory per block U
960 x 32 x 2 = 60 KiB, h 64 x 960 x 2 = 120 KiB, P, c, m and outputs 15 KiB
(8 KiB more with the residuals): 195 to 203 KiB of the 227 KiB a block may
have, each buffer rounded up to 1 KiB as Mosaic GPU allocates it
(`smem_bytes`). Float32 (TF32) operands would
double U's slice and h to 360 KiB: they would need h streamed through in
chunks of K, which this first form does not do. Mosaic GPU's Lane lowering
semantics could not match the accumulator's layout with P's ("Incompatible
FragmentedArray layouts"); the Warpgroup semantics infer the layouts.

With `residuals` the kernel also writes, a step, what the backward pass
(`persistent_lstm_backward`) needs: the block's activations [σ(i), σ(f),
tanh(j), σ(o)] (by blocks: (T, G, 4, 64, u); the wrapper returns them
gate-major) and its c_t; 8 KiB more shared memory a block at u = 8 (203 KiB
in all at hidden 951). Without
it the kernel is the plain forward above.

Modes (`grid_barrier.MODES`): 'persistent' is the kernel above (with one
block it needs no barrier), 'per_step' the kernel launched once a step
(what runs in Pallas' GPU interpreter with several blocks); for timing only,
as they may read stale values: 'unfenced' the same without the barrier's
proxy fences, 'no_barrier' one launch without the barrier.

Example::

  (c_T, h_T), hs = persistent_lstm_forward(projected, kernel, h0, c0, state_mask=mask)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.common import gate_update
from lm_zoo.kernels.grid_barrier import (
  check_blocks_run,
  check_mode,
  grid_barrier,
  one_model_a_launch,
)
from lm_zoo.kernels.persistent_blocks import (
  K_MULTIPLE,
  SMEM_BYTES,
  UNIT_MULTIPLE,
  block_width,
  copy_in,
  smem_bytes_of,
  swizzled,
)

GATES = 4
ROWS = 64  # wgmma's M for one warpgroup
MAX_BLOCK_UNITS = 64  # 4 gates x 64 = 256, wgmma's largest N


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Layout:
  """The kernel's padded sizes.

  Attributes:
    rows: the batch padded to wgmma's 64 rows.
    units: the hidden size padded, n_pad = blocks x block_units.
    blocks: G, the grid's blocks.
  """

  rows: int
  units: int
  blocks: int

  @property
  def block_units(self) -> int:
    return self.units // self.blocks


def grid_for(batch: int, hidden: int, blocks: int | None = None) -> Layout:
  """The padded sizes for a batch and hidden size, shared memory unchecked;
  `blocks` None takes the most (8 units each)."""
  if batch > ROWS:
    raise ValueError(f'batch must be at most {ROWS} (one warpgroup of rows), got {batch}')
  if blocks is None:
    blocks = _round_up(hidden, K_MULTIPLE) // UNIT_MULTIPLE
  if blocks < 1:
    raise ValueError(f'blocks must be positive, got {blocks}')
  u = block_width(hidden, blocks)
  if u > MAX_BLOCK_UNITS:
    raise ValueError(
      f'blocks={blocks} gives each block {u} of {hidden} units; at most {MAX_BLOCK_UNITS}'
    )
  return Layout(ROWS, blocks * u, blocks)


def layout_for(batch: int, hidden: int, blocks: int | None = None) -> Layout:
  """`grid_for`'s sizes, refused where this kernel's shared memory does not
  fit. Raises ValueError naming what does not fit."""
  layout = grid_for(batch, hidden, blocks)
  if (needed := smem_bytes(layout)) > SMEM_BYTES:
    raise ValueError(
      f'hidden={hidden} needs {needed} bytes of shared memory a block (at most {SMEM_BYTES})'
    )
  return layout


def scratch_types(layout: Layout, saves: bool) -> list:
  """A block's shared memory: U's slice and h (bfloat16, swizzled); P's
  slice, c, m, h_t's slice (float32) and m ⊙ h_t's (bfloat16); the
  barriers; with `saves`, the gate activations' tile (float32)."""
  rows, n, u = layout.rows, layout.units, layout.block_units
  f32, bf16 = jnp.float32, jnp.bfloat16
  return [
    swizzled((n, GATES * u), bf16),
    swizzled((rows, n), bf16),
    plgpu.SMEM((rows, GATES * u), f32),
    plgpu.SMEM((rows, u), f32),
    plgpu.SMEM((rows, u), f32),
    plgpu.SMEM((rows, u), f32),
    plgpu.SMEM((rows, u), bf16),
    plgpu.Barrier(num_barriers=5),
    *([plgpu.SMEM((GATES, rows, u), f32)] if saves else ()),
  ]


def smem_bytes(layout: Layout, saves: bool = False) -> int:
  """The shared memory a block takes, as Mosaic GPU counts it (`smem_bytes_of`)."""
  return smem_bytes_of(scratch_types(layout, saves))


def _cell_step(h_s, u_s, p_s, c_s, layout: Layout, cap_input_gate: bool):
  """gates = P_t + h_{t-1} U on the tensor cores, then the cell update:
  c_t into `c_s`; returns the activations (σ(i), σ(f), tanh(j), σ(o)) and
  h_t (float32)."""

  def product(acc):
    plgpu.wgmma(acc, h_s, u_s)
    return acc[...]

  gates = pl.run_scoped(product, plgpu.ACC((layout.rows, GATES * layout.block_units))) + p_s[...]
  u = layout.block_units
  acts, c, h = gate_update(
    [gates[:, k * u : (k + 1) * u] for k in range(GATES)], c_s[...], cap_input_gate
  )
  c_s[...] = c
  return acts, h


def _body(*refs, layout: Layout, steps: int, cap_input_gate: bool, mode: str, saves: bool):
  outputs = 5 if saves else 3
  p_g, u_g, h0_g, c0_g, m_g = refs[:5]
  hs_g, hist_g, c_g, *saved_g = refs[5 : 5 + outputs]
  u_s, h_s, p_s, c_s, m_s, h32_s, h16_s, bars, *act_s = refs[5 + outputs :]
  g = jax.lax.axis_index('blocks')
  units = pl.ds(g * layout.block_units, layout.block_units)
  copy_in(u_g.at[g], u_s, bars.at[0])
  copy_in(c0_g.at[:, units], c_s, bars.at[1])
  copy_in(m_g.at[:, units], m_s, bars.at[4])
  sync = grid_barrier(mode, layout.blocks)

  @pl.loop(0, steps)
  def _step(t):
    plgpu.copy_gmem_to_smem(p_g.at[t, g], p_s, bars.at[2])  # needs no other block

    @pl.when(t == 0)
    def _():
      plgpu.copy_gmem_to_smem(h0_g, h_s, bars.at[3])

    @pl.when(t > 0)
    def _():
      if sync is not None:
        sync.wait(t)
      plgpu.copy_gmem_to_smem(hist_g.at[t - 1], h_s, bars.at[3])

    plgpu.barrier_wait(bars.at[2])
    plgpu.barrier_wait(bars.at[3])
    acts, h = _cell_step(h_s, u_s, p_s, c_s, layout, cap_input_gate)
    h32_s[...] = h
    h16_s[...] = (h * m_s[...]).astype(jnp.bfloat16)  # what the next product reads
    for k, act in enumerate(acts if saves else ()):
      act_s[0][k] = act
    plgpu.commit_smem()  # the stores above, before TMA reads them
    plgpu.copy_smem_to_gmem(h32_s, hs_g.at[t, :, units])
    plgpu.copy_smem_to_gmem(h16_s, hist_g.at[t, :, units])
    if saves:  # the activations and c_t, for the backward pass
      plgpu.copy_smem_to_gmem(act_s[0], saved_g[0].at[t, g])
      plgpu.copy_smem_to_gmem(c_s, saved_g[1].at[t, :, units])
    plgpu.wait_smem_to_gmem(0)  # written to global memory before the signal
    if sync is not None:
      sync.arrive()

  plgpu.copy_smem_to_gmem(c_s, c_g.at[:, units])
  plgpu.wait_smem_to_gmem(0)


def _kernel(layout: Layout, steps: int, cap_input_gate: bool, mode: str, saves: bool, interpret):
  """The kernel of `steps` steps: (P blocks, U blocks, m ⊙ h0, c0, m) -> (hs,
  the history of m ⊙ h, c_T), and with `saves` the activations (T, G, 4, 64,
  u) and c_1..c_T."""
  rows, n, u = layout.rows, layout.units, layout.block_units
  f32, bf16 = jnp.float32, jnp.bfloat16
  body = functools.partial(
    _body,
    layout=layout,
    steps=steps,
    cap_input_gate=cap_input_gate,
    mode=mode,
    saves=saves,
  )
  saved = [
    jax.ShapeDtypeStruct((steps, layout.blocks, GATES, rows, u), f32),
    jax.ShapeDtypeStruct((steps, rows, n), f32),
  ]
  return plgpu.kernel(
    body,
    out_type=(
      jax.ShapeDtypeStruct((steps, rows, n), f32),
      jax.ShapeDtypeStruct((steps, rows, n), bf16),
      jax.ShapeDtypeStruct((rows, n), f32),
      *(saved if saves else ()),
    ),
    scratch_types=scratch_types(layout, saves),
    grid=(layout.blocks,),
    grid_names=('blocks',),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret,
  )


def by_blocks(gates, layout: Layout, lead_sizes):
  """(..., L, 4n) gate-major columns -> (..., G, L', 4u): block g's four gates'
  columns of its units contiguous, each leading axis zero-padded to `lead_sizes`."""
  *lead, width = gates.shape
  n = width // GATES
  split = gates.reshape(*lead, GATES, n)
  pads = [(0, size - have) for have, size in zip(lead, lead_sizes)]
  split = jnp.pad(split, pads + [(0, 0), (0, layout.units - n)])
  split = split.reshape(*lead_sizes, GATES, layout.blocks, layout.block_units)
  split = jnp.moveaxis(split, -2, len(lead) - 1)
  return split.reshape(*split.shape[:-2], GATES * layout.block_units)


def padded(state, layout: Layout, dtype):
  batch, n = state.shape
  return jnp.pad(state, ((0, layout.rows - batch), (0, layout.units - n))).astype(dtype)


def _check_args(projected, recurrent_kernel, h0, c0, state_mask, mode: str):
  check_mode(mode)
  if projected.ndim != 3 or projected.shape[0] < 1:
    raise ValueError(f'projected must be (T >= 1, B, 4n), got {projected.shape}')
  steps, batch, width = projected.shape
  if recurrent_kernel.shape != (width // GATES, width) or width % GATES:
    raise ValueError(
      f'recurrent_kernel must be (n, 4n) = {(width // GATES, width)}, got {recurrent_kernel.shape}'
    )
  for name, state in (('h0', h0), ('c0', c0), ('state_mask', state_mask)):
    if state is not None and state.shape != (batch, width // GATES):
      raise ValueError(f'{name} must be (B, n) = {(batch, width // GATES)}, got {state.shape}')


def _run(p, u, h, c, m, layout: Layout, cap_input_gate: bool, mode: str, saves: bool, interpret):
  """The kernel(s) of `mode` over the re-laid-out window: (hs, c_T, *saved);
  vmapped, a model at a time (`one_model_a_launch`)."""

  def launches(p, u, h, c, m):
    if mode != 'per_step':
      kernel = _kernel(layout, p.shape[0], cap_input_gate, mode, saves, interpret)
      hs, _, c, *saved = kernel(p, u, h, c, m)
      return hs, c, *saved
    kernel = _kernel(layout, 1, cap_input_gate, mode, saves, interpret)

    def step(carry, p_t):
      hs, history, c, *saved = kernel(p_t[None], u, *carry, m)
      return (history[0], c), (hs[0], *(a[0] for a in saved))

    (_, c), (hs, *saved) = jax.lax.scan(step, (h, c), p)
    return hs, c, *saved

  return one_model_a_launch(launches)(p, u, h, c, m)


def unblocked_gates(blocked, batch: int, n: int):
  """(..., G, 4, rows, u) by blocks -> (..., B, 4n) gate-major, unpadded."""
  *lead, blocks, gates, rows, u = blocked.shape
  split = jnp.moveaxis(blocked, -4, -2).reshape(*lead, gates, rows, blocks * u)
  return jnp.moveaxis(split[..., :batch, :n], -3, -2).reshape(*lead, batch, gates * n)


def persistent_lstm_forward(
  projected: jax.Array,
  recurrent_kernel: jax.Array,
  h0: jax.Array,
  c0: jax.Array,
  *,
  state_mask: jax.Array | None = None,
  cap_input_gate: bool = False,
  blocks: int | None = None,
  mode: str = 'persistent',
  interpret: Any = None,
  residuals: bool = False,
):
  """The LSTM's forward pass over a window in one persistent kernel.

  Args:
    projected: P_t = x_t W + b for every step, (T, B, 4n), gate order i, f, j, o.
    recurrent_kernel: U, (n, 4n); multiplied in bfloat16.
    h0, c0: the carry, each (B, n); B at most 64.
    state_mask: m, (B, n): multiplies h_{t-1} before U (variational dropout
      on the state); None keeps h.
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    blocks: the grid's blocks G (None: one per 8 units of n padded to 32).
    mode: 'persistent', 'per_step', or 'unfenced' and 'no_barrier' (timing
      only: they may read stale values with G > 1); `grid_barrier` says what
      each launches.
    interpret: None compiles for the GPU; Pallas' Mosaic GPU interpreter
      params (`plgpu.InterpretGPUParams()`) run it on any backend.
    residuals: also return what the backward pass needs (two more writes a
      step: 4u + u columns a block).

  Returns:
    ((c_T, h_T), outputs h_1..h_T of shape (T, B, n)), all float32; with
    `residuals` a third item (activations [σ(i), σ(f), tanh(j), σ(o)] of
    shape (T, B, 4n), cell states c_1..c_T of shape (T, B, n)).
  """
  _check_args(projected, recurrent_kernel, h0, c0, state_mask, mode)
  steps, batch, width = projected.shape
  n = width // GATES
  layout = layout_for(batch, n, blocks)
  if residuals and (needed := smem_bytes(layout, saves=True)) > SMEM_BYTES:
    raise ValueError(
      f'residuals=True at hidden={n} needs {needed} bytes of shared memory a block '
      f'(at most {SMEM_BYTES})'
    )
  check_blocks_run(layout.blocks, mode, interpret)
  p = by_blocks(projected.astype(jnp.float32), layout, (steps, layout.rows))
  u = by_blocks(recurrent_kernel.astype(jnp.bfloat16), layout, (layout.units,))
  m = padded(jnp.ones_like(h0) if state_mask is None else state_mask, layout, jnp.float32)
  # m ⊙ h_0 in float32, then bfloat16: what the kernel writes of every later h.
  h = (padded(h0, layout, jnp.float32) * m).astype(jnp.bfloat16)
  c = padded(c0, layout, jnp.float32)
  hs, c, *saved = _run(p, u, h, c, m, layout, cap_input_gate, mode, residuals, interpret)
  hs = hs[:, :batch, :n]
  out = (c[:batch, :n], hs[-1]), hs
  if not residuals:
    return out
  acts, cs = saved
  return (*out, (unblocked_gates(acts, batch, n), cs[:, :batch, :n]))
