"""A wgmma product whose left operand streams from global memory through two
shared-memory buffers, the copy of chunk k + 1 in flight while chunk k is
multiplied: what the persistent Mogrifier kernels (`persistent_mogrifier`,
`persistent_mogrifier_backward`) use for every product whose left operand
is a whole vector another block wrote (Hopper, Mosaic GPU).

Example (inside a kernel body)::

  gates = streamed_product((64, 32), chunks, copy, buffers, bars, lambda k: weights.at[k])
"""

from __future__ import annotations

from typing import Callable

from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

BUFFERS = 2  # the copy of chunk k+1 in flight while chunk k is multiplied


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
        plgpu.wgmma_wait(1)  # chunk k-1's product has read its buffer
        copy(refill, buffers.at[refill % BUFFERS], bars.at[refill % BUFFERS])

    return acc[...]

  return pl.run_scoped(accumulate, plgpu.ACC(shape))
