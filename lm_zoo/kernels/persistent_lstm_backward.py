"""The LSTM recurrence's backward chain over a whole window as ONE persistent
Mosaic GPU kernel (Hopper: TMA copies, wgmma), the reverse of
`persistent_lstm`'s forward kernel.

Given, for every step, the factors of the cell update that do not depend on
the incoming gradients (`lm_zoo.cells.lstm_recurrence.backward_factors`:
σ(f_t), dc/dh of h = σ(o) tanh(c), and the gates' scales s_t), the outputs'
gradients dL/dh_t, U (n, 4n), the forward's mask m on the fed-back state
(B, n) and the gradients of the final carry, it runs for t = T-1 down to 0

    d_h = dL/dh_t + (dG_{t+1} Uᵀ) ⊙ m   (the last step's: dL/dh_T)
    d_c = d_c + d_h ⊙ dc/dh_t
    dG_t = s_t ⊙ [d_c, d_c, d_c, d_h]
    d_c = d_c ⊙ σ(f_t)

as `lstm_recurrence`'s backward scan does with ``dtype=jnp.bfloat16``: the
product's operands dG and U in bfloat16, summed in float32; the factors, d_c,
d_h and dG float32. It returns dG_t (float32: the gradient of the
projections, and of U through dU = H_prevᵀ dG, one product that XLA runs
after), d_c_0 and d_h_0 = (dG_0 Uᵀ) ⊙ m (one small product in XLA). The
mask's own gradient, Σ_t (dG_t Uᵀ) ⊙ h_{t-1}, needs the h_{t-1} the kernel
does not have: `lm_zoo.cells.persistent_lstm` takes it in XLA after.

The grid is the forward's: G blocks (one warpgroup each), block g owns u
hidden units. It keeps U's rows of its units, (u, 4 n_pad) bfloat16, in shared
memory (copied once; read transposed, as wgmma's K-major B operand), its slice
of m (copied once) and its d_c. Each step needs the WHOLE dG_{t+1} (64 rows,
4 n_pad bfloat16, written by every block), which does not fit shared memory
at the recipes' sizes: it streams through two buffers of 64 x `chunk` columns
along the summed axis, the TMA copy of chunk k+1 in flight while wgmma
multiplies chunk k, all into one (64, u) float32 accumulator. The block then
writes its 4u columns of dG_t to a bfloat16 history (T, 64, 4 n_pad), which
the step before reads, and to the float32 output, waits for the writes, and
arrives at the grid's barrier (`grid_barrier`); the next step first waits
there for every block, as the forward does. The summed axis is in the
by-blocks order (block, gate, unit) of the history's columns; U's columns are
re-laid out alike.

At hidden 951, batch 64: 120 blocks of 8 units, chunk 480 (the largest
multiple of 32 columns dividing 3840, at most 512), 8 chunks a step; shared
memory per block U's rows 8 x 3840 x 2 = 60 KiB, buffers 2 x 64 x 480 x 2 =
120 KiB, factors, d_c, m and dG_t 30 KiB: 210 KiB of 227 KiB (Mosaic GPU's
count, `backward_smem_bytes`). Each block reads the whole dG_{t+1}, 480
KiB, a step: 56 MiB of L2 reads a step for the grid, four times the
forward's (h is n wide, dG 4n).

Modes (`grid_barrier.MODES`) as the forward's: 'persistent' (one launch),
'per_step' (one launch a step; what runs interpreted with several blocks),
'unfenced' (without the barrier's proxy fences) and 'no_barrier' (timing
only: they may read stale values with several blocks).

Example::

  d_gates, d_c0, d_h0 = persistent_lstm_backward(
    d_hs, gate_scales, forget, d_c_from_h, kernel, d_c_last, d_h_last, state_mask=mask
  )
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.common import product
from lm_zoo.kernels.grid_barrier import (
  check_blocks_run,
  check_mode,
  grid_barrier,
  one_model_a_launch,
)
from lm_zoo.kernels.persistent_blocks import (
  BUFFERS,
  K_MULTIPLE,
  SMEM_BYTES,
  copy_in,
  smem_bytes_of,
  swizzled,
)
from lm_zoo.kernels.persistent_lstm import (
  GATES,
  Layout,
  by_blocks,
  layout_for,
  padded,
  unblocked_gates,
)

CHUNK_LIMIT = 512  # columns of dG a buffer holds: 64 x 512 bfloat16 = 64 KiB
FACTORS = 7  # the four gates' scales, σ(f), dc/dh, dL/dh_t


def chunk_for(layout: Layout, chunk: int | None = None) -> int:
  """`chunk` checked, or (None) the largest multiple of 32 columns dividing
  4 n_pad, at most CHUNK_LIMIT."""
  width = GATES * layout.units
  if chunk is None:
    return max(c for c in range(K_MULTIPLE, CHUNK_LIMIT + 1, K_MULTIPLE) if width % c == 0)
  if chunk < 1 or chunk % K_MULTIPLE or width % chunk:
    raise ValueError(f'chunk must be a multiple of {K_MULTIPLE} dividing {width}, got {chunk}')
  return chunk


def backward_scratch_types(layout: Layout, chunk: int, transposed: bool) -> list:
  """A block's shared memory: U's rows and dG's buffers (bfloat16), the
  factors, d_c, m, dG_t (float32 and bfloat16), the barriers."""
  rows, n, u = layout.rows, layout.units, layout.block_units
  f32, bf16 = jnp.float32, jnp.bfloat16
  return [
    swizzled((u, GATES * n), bf16) if transposed else plgpu.SMEM((GATES * n, u), bf16),
    swizzled((BUFFERS, rows, chunk), bf16),
    plgpu.SMEM((FACTORS, rows, u), f32),
    plgpu.SMEM((rows, u), f32),
    plgpu.SMEM((rows, u), f32),
    plgpu.SMEM((GATES, rows, u), f32),
    plgpu.SMEM((GATES, rows, u), bf16),
    plgpu.Barrier(num_barriers=BUFFERS + 4),
  ]


def backward_smem_bytes(layout: Layout, chunk: int) -> int:
  """The shared memory a block takes, as Mosaic GPU counts it (`smem_bytes_of`)."""
  return smem_bytes_of(backward_scratch_types(layout, chunk, transposed=True))


def _u_chunk(ut_s, cols, transposed: bool):
  """U[units, cols]ᵀ, (chunk, u): compiled, the (u, 4 n_pad) rows read
  transposed (wgmma's K-major B operand; its N = u is narrower than a
  swizzle tile); Pallas' GPU interpreter has no transposed wgmma operands,
  so there U's rows come laid out (4 n_pad, u) already."""
  return ut_s.at[:, cols].transpose((1, 0)) if transposed else ut_s.at[cols]


def _product(next_chunk, buf_s, ut_s, bars, layout: Layout, chunk: int, transposed: bool):
  """dG_{t+1} U[units]ᵀ, (64, u) float32: Σ over chunks of the summed axis,
  each copied by `next_chunk(k, buffer, barrier)`; the copy of chunk k+1
  runs while wgmma multiplies chunk k."""
  chunks = GATES * layout.units // chunk

  def accumulate(acc):
    for k in range(min(BUFFERS, chunks)):
      next_chunk(k, buf_s.at[k], bars.at[k])
    for k in range(chunks):
      slot = k % BUFFERS
      plgpu.barrier_wait(bars.at[slot])
      u_t = _u_chunk(ut_s, pl.ds(k * chunk, chunk), transposed)
      plgpu.wgmma(acc, buf_s.at[slot], u_t)
      refill = k - 1 + BUFFERS
      if k >= 1 and refill < chunks:
        plgpu.wgmma_wait(1)  # chunk k-1's product has read its buffer
        next_chunk(refill, buf_s.at[refill % BUFFERS], bars.at[refill % BUFFERS])
    return acc[...]

  return pl.run_scoped(accumulate, plgpu.ACC((layout.rows, layout.block_units)))


def _cell_gradient(x_s, dc_s, g32_s, g16_s, d_h_next):
  """dG_t into `g32_s` and `g16_s` (4, 64, u), d_c_{t-1} into `dc_s`."""
  scales, (forget, d_c_from_h, d_h_out) = [x_s[k] for k in range(GATES)], (x_s[4], x_s[5], x_s[6])
  d_h = d_h_out + d_h_next
  d_c = dc_s[...] + d_h * d_c_from_h
  for k, d in enumerate((d_c, d_c, d_c, d_h)):
    d_gate = scales[k] * d
    g32_s[k] = d_gate
    g16_s[k] = d_gate.astype(jnp.bfloat16)  # whole rows: a column slice is bank-conflicted
  dc_s[...] = d_c * forget


def _body(*refs, layout: Layout, steps: int, chunk: int, mode: str, transposed: bool):
  x_g, ut_g, dg_in_g, dc_g, m_g, dg32_g, hist_g, dc0_g = refs[:8]
  ut_s, buf_s, x_s, dc_s, m_s, g32_s, g16_s, bars = refs[8:]
  g = jax.lax.axis_index('blocks')
  u = layout.block_units
  units = pl.ds(g * u, u)
  copy_in(ut_g.at[g], ut_s, bars.at[BUFFERS])
  copy_in(dc_g.at[:, units], dc_s, bars.at[BUFFERS + 1])
  copy_in(m_g.at[:, units], m_s, bars.at[BUFFERS + 3])
  sync = grid_barrier(mode, layout.blocks)

  @pl.loop(0, steps)
  def _step(r):
    t = steps - 1 - r
    plgpu.copy_gmem_to_smem(x_g.at[t, g], x_s, bars.at[BUFFERS + 2])  # needs no other block
    if sync is not None:

      @pl.when(r > 0)
      def _():
        sync.wait(r)

    def next_chunk(k, buffer, bar):
      cols = pl.ds(k * chunk, chunk)

      @pl.when(r == 0)
      def _():
        plgpu.copy_gmem_to_smem(dg_in_g.at[:, cols], buffer, bar)

      @pl.when(r > 0)
      def _():
        plgpu.copy_gmem_to_smem(hist_g.at[t + 1, :, cols], buffer, bar)

    d_h_next = _product(next_chunk, buf_s, ut_s, bars, layout, chunk, transposed)
    plgpu.barrier_wait(bars.at[BUFFERS + 2])
    _cell_gradient(x_s, dc_s, g32_s, g16_s, d_h_next * m_s[...])
    plgpu.commit_smem()  # the stores above, before TMA reads them
    plgpu.copy_smem_to_gmem(g32_s, dg32_g.at[t, g])
    for k in range(GATES):
      plgpu.copy_smem_to_gmem(g16_s.at[k], hist_g.at[t, :, pl.ds((g * GATES + k) * u, u)])
    plgpu.wait_smem_to_gmem(0)  # written to global memory before the signal
    if sync is not None:
      sync.arrive()

  plgpu.copy_smem_to_gmem(dc_s, dc0_g.at[:, units])
  plgpu.wait_smem_to_gmem(0)


def _kernel(layout: Layout, steps: int, chunk: int, mode: str, interpret: Any):
  """(factors (T, G, 7, 64, u), U's rows (G, u, 4 n_pad; interpreted
  (G, 4 n_pad, u)), dG_T, d_c_T, m) -> (dG (T, G, 4, 64, u), dG's bfloat16
  history (T, 64, 4 n_pad), d_c_0)."""
  rows, n, u = layout.rows, layout.units, layout.block_units
  f32, bf16 = jnp.float32, jnp.bfloat16
  transposed = interpret is None
  body = functools.partial(
    _body, layout=layout, steps=steps, chunk=chunk, mode=mode, transposed=transposed
  )
  return plgpu.kernel(
    body,
    out_type=(
      jax.ShapeDtypeStruct((steps, layout.blocks, GATES, rows, u), f32),
      jax.ShapeDtypeStruct((steps, rows, GATES * n), bf16),
      jax.ShapeDtypeStruct((rows, n), f32),
    ),
    scratch_types=backward_scratch_types(layout, chunk, transposed),
    grid=(layout.blocks,),
    grid_names=('blocks',),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret,
  )


def _run(x, ut, dc, m, layout: Layout, chunk: int, mode: str, interpret: Any):
  """The kernel(s) of `mode` over the re-laid-out factors: (dG by blocks,
  d_c_0); vmapped, a model at a time (`one_model_a_launch`)."""

  def launches(x, ut, dc, m):
    dg_in = jnp.zeros((layout.rows, GATES * layout.units), jnp.bfloat16)  # dG_T: none
    if mode != 'per_step':
      dg, _, dc = _kernel(layout, x.shape[0], chunk, mode, interpret)(x, ut, dg_in, dc, m)
      return dg, dc
    kernel = _kernel(layout, 1, chunk, mode, interpret)

    def step(carry, x_t):
      dg, history, dc = kernel(x_t[None], ut, *carry, m)
      return (history[0], dc), dg[0]

    (_, dc), dg = jax.lax.scan(step, (dg_in, dc), x, reverse=True)
    return dg, dc

  return one_model_a_launch(launches)(x, ut, dc, m)


def _check_args(
  d_hs, gate_scales, forget, d_c_from_h, recurrent_kernel, d_c_last, d_h_last, state_mask, mode
):
  check_mode(mode)
  if d_hs.ndim != 3 or d_hs.shape[0] < 1:
    raise ValueError(f'd_hs must be (T >= 1, B, n), got {d_hs.shape}')
  steps, batch, n = d_hs.shape
  wanted = {
    'gate_scales': (gate_scales, (steps, batch, GATES * n)),
    'forget': (forget, d_hs.shape),
    'd_c_from_h': (d_c_from_h, d_hs.shape),
    'recurrent_kernel': (recurrent_kernel, (n, GATES * n)),
    'd_c_last': (d_c_last, (batch, n)),
    'd_h_last': (d_h_last, (batch, n)),
    'state_mask': (state_mask, (batch, n)),
  }
  for name, (array, shape) in wanted.items():
    if array is not None and array.shape != shape:
      raise ValueError(f'{name} must be {shape} (d_hs is {d_hs.shape}), got {array.shape}')


def _factors_by_blocks(parts, layout: Layout):
  """(T, B, n) arrays -> (T, G, len(parts), 64, u), zero-padded."""
  steps, batch, n = parts[0].shape
  x = jnp.pad(
    jnp.stack(parts, 1), ((0, 0),) * 2 + ((0, layout.rows - batch), (0, layout.units - n))
  )
  x = x.reshape(steps, len(parts), layout.rows, layout.blocks, layout.block_units)
  return jnp.moveaxis(x, 3, 1).astype(jnp.float32)


def persistent_lstm_backward(
  d_hs: jax.Array,
  gate_scales: jax.Array,
  forget: jax.Array,
  d_c_from_h: jax.Array,
  recurrent_kernel: jax.Array,
  d_c_last: jax.Array,
  d_h_last: jax.Array,
  *,
  state_mask: jax.Array | None = None,
  blocks: int | None = None,
  chunk: int | None = None,
  mode: str = 'persistent',
  interpret: Any = None,
):
  """The LSTM's backward chain over a window in one persistent kernel.

  Args:
    d_hs: dL/dh_t for every step, (T, B, n).
    gate_scales, forget, d_c_from_h: `backward_factors`' scales (T, B, 4n),
      σ(f) and dc/dh (T, B, n) each.
    recurrent_kernel: U, (n, 4n); multiplied in bfloat16.
    d_c_last, d_h_last: the final carry's gradients, each (B, n); B at most 64.
    state_mask: the forward's m, (B, n); None: none.
    blocks, mode, interpret: as `persistent_lstm_forward`'s.
    chunk: the columns of dG a buffer holds, a multiple of 32 dividing
      4 n_pad (None: the largest up to 512).

  Returns:
    (dG: dL/d gate pre-activations (T, B, 4n), d_c_0, d_h_0), all float32.
  """
  args = (d_hs, gate_scales, forget, d_c_from_h, recurrent_kernel, d_c_last, d_h_last)
  _check_args(*args, state_mask, mode)
  steps, batch, n = d_hs.shape
  layout = layout_for(batch, n, blocks)
  chunk = chunk_for(layout, chunk)
  if (needed := backward_smem_bytes(layout, chunk)) > SMEM_BYTES:
    raise ValueError(
      f'hidden={n} needs {needed} bytes of shared memory a block backward (at most {SMEM_BYTES})'
    )
  check_blocks_run(layout.blocks, mode, interpret)
  # dG_T Uᵀ stands for dL/dh_T: fold it into the last step's output gradient.
  d_hs = jnp.concatenate([d_hs[:-1], (d_hs[-1] + d_h_last)[None]])
  x = _factors_by_blocks([*jnp.split(gate_scales, GATES, -1), forget, d_c_from_h, d_hs], layout)
  u = by_blocks(recurrent_kernel.astype(jnp.bfloat16), layout, (layout.units,))
  rows_by_block = jnp.moveaxis(u, 0, 1).reshape(layout.blocks, layout.block_units, -1)
  if interpret is not None:  # `_u_chunk`: no transposed operands there
    rows_by_block = jnp.swapaxes(rows_by_block, 1, 2)
  m = jnp.ones_like(d_h_last) if state_mask is None else state_mask
  dc = padded(d_c_last, layout, jnp.float32)
  dg, dc = _run(
    x, rows_by_block, dc, padded(m, layout, jnp.float32), layout, chunk, mode, interpret
  )
  d_gates = unblocked_gates(dg, batch, n)
  d_h0 = product(d_gates[0], recurrent_kernel, jnp.bfloat16, None, transpose_b=True) * m
  return d_gates, dc[:batch, :n], d_h0
