"""What a block of every persistent kernel (`persistent_lstm`,
`persistent_lstm_backward`, `persistent_mogrifier`,
`persistent_mogrifier_backward`; Hopper, Mosaic GPU) does the same way: the
columns it owns (`block_width`), its bfloat16 wgmma operands swizzled by 64
bytes (`swizzled`), copies in (`copy_in`, `copy_in_parts`), the shared
memory its scratch takes as Mosaic GPU allocates it (`smem_bytes_of`, at
most `SMEM_BYTES`); and, in the Mogrifier's, a wgmma product whose left
operand, a whole vector another block wrote, streams from global memory
through two shared-memory buffers, the copy of chunk k + 1 in flight while
chunk k is multiplied (`streamed_product`).

Example (inside a kernel body)::

  gates = streamed_product((64, 32), chunks, copy, buffers, bars, lambda k: weights.at[k])
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

BUFFERS = 2  # the copy of chunk k+1 in flight while chunk k is multiplied
SMEM_ALIGNMENT = 1024  # bytes: Pallas allocates each shared memory buffer at a multiple
SMEM_BYTES = 227 * 1024  # what a block may have on Hopper
SWIZZLE = 64  # bytes, both wgmma operands: 32 bfloat16 columns
K_MULTIPLE = SWIZZLE // 2  # a summed axis' multiple: one swizzle tile of bfloat16
UNIT_MULTIPLE = 8  # the accumulator's column tile


def block_width(size: int, blocks: int) -> int:
  """The columns of `size` a block owns: a power of two from 8 (the
  accumulator's column tile; the TMA copies of a block's (k, 64, width)
  float32 tiles stride over at most 5 dimensions, which 24 or 48 columns
  exceed), `blocks` of them a multiple of 32 (a swizzle tile)."""
  width = UNIT_MULTIPLE
  while width * blocks < size or (blocks * width) % K_MULTIPLE:
    width *= 2
  return width


def swizzled(shape, dtype):
  """A bfloat16 wgmma operand's shared memory: (8, 32) tiles swizzled by 64 bytes."""
  transforms = (plgpu.TilingTransform((8, K_MULTIPLE)), plgpu.SwizzleTransform(SWIZZLE))
  return plgpu.SMEM(shape, dtype, transforms=transforms)


def copy_in(src, dst, barrier):
  """A TMA copy of `src` into `dst`, waited for."""
  plgpu.copy_gmem_to_smem(src, dst, barrier)
  plgpu.barrier_wait(barrier)


def copy_in_parts(src, dst, barrier):
  """`copy_in` a leading index at a time, for the one-off copies of arrays
  of 3 or more axes: a TMA copy strides over at most 5 dimensions, which
  such an array tiled and swizzled may exceed (a block's [W; U] with 16
  units or more, A's pairs in 2 slots)."""
  for i in range(dst.shape[0]):
    copy_in(src.at[i], dst.at[i], barrier)


def streamed_product(shape, chunks: int, copy: Callable, buffers, bars, operand: Callable):
  """Σ_k buffer_k @ operand(k), `shape` float32, over `chunks` chunks: chunk
  k of the left operand copied by copy(k, buffer, barrier) into one of the
  BUFFERS `buffers` (barriers `bars`), operand(k) its right operand in
  shared memory. A loop, not unrolled: Mosaic GPU's layout inference takes
  time with every op."""

  def accumulate(acc):
    for k in range(min(BUFFERS, chunks)):
      copy(k, buffers.at[k], bars.at[k])

    @pl.loop(0, chunks)
    def _chunk(k):
      plgpu.barrier_wait(bars.at[k % BUFFERS])
      plgpu.wgmma(acc, buffers.at[k % BUFFERS], operand(k))
      refill = k - 1 + BUFFERS

      @pl.when((k >= 1) & (refill < chunks))
      def _():
        # This thread's chunk k-1 product has read its buffer; Pallas' own
        # warpgroup barrier before each TMA copy (never turned off with
        # unsafe_no_auto_barriers) holds the copy until every warp has too.
        plgpu.wgmma_wait(1)
        copy(refill, buffers.at[refill % BUFFERS], bars.at[refill % BUFFERS])

    return acc[...]

  return pl.run_scoped(accumulate, plgpu.ACC(shape))


def smem_bytes_of(scratch_types: Sequence) -> int:
  """The shared memory a block's `scratch_types` take: every buffer rounded
  up to Pallas' 1024-byte alignment, and 8 bytes a barrier (Mosaic GPU's own
  count, which it refuses above its bound)."""
  total = 0
  for scratch in scratch_types:
    if isinstance(scratch, plgpu.Barrier):
      total += 8 * math.prod(scratch.num_barriers)  # a shape: (3,) for 3 barriers
    else:
      size = math.prod(scratch.shape) * jnp.dtype(scratch.dtype).itemsize
      total += -(-size // SMEM_ALIGNMENT) * SMEM_ALIGNMENT
  return total
