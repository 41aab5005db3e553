"""What one crossing of the persistent kernels' grid barrier costs on a GPU,
and whether it holds (lm_zoo.kernels.grid_barrier).

A persistent Mogrifier would cross it about 2 x rounds + 1 times a step (each
round reads the whole of the other vector), an aLSTM twice a step: this
measures the crossing alone, with the traffic of one. `barrier_rounds`
launches G blocks for R rounds; in round r block g

1. writes its board slot, a (64, 8) float32 tile (a block's slice of h at 8
   units) filled with r·G + g, by TMA, into board r mod 2, and waits for
   the write;
2. crosses the barrier (arrive, then wait for (r + 1)·G arrivals);
3. reads its neighbour's slot (g + 1 mod G) of the same board by TMA and adds
   the squared difference from r·G + g + 1 to its stale sum.

Two boards suffice: a block writes board r mod 2 again in round r + 2 only
after every block has arrived in round r + 1, i.e. has read round r. The
result is the stale sum of every block: zero where the barrier held. Without
the barrier ('no_barrier') blocks read slots not yet written, which shows
that the sum can see a stale read; its time is the floor of the copies.

Example::

  stale = barrier_rounds(blocks=120, rounds=770, mode='persistent')()
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.grid_barrier import check_blocks_run, check_mode, grid_barrier

TILE = (64, 8)  # a block's slice of the state at 8 units: what the kernels write a step


def _body(stale_g, board_g, mine_s, seen_s, stale_s, bars, *, blocks: int, rounds: int, mode: str):
  g = jax.lax.axis_index('blocks')
  neighbour = jax.lax.rem(g + 1, blocks)
  sync = grid_barrier(mode, blocks)
  stale_s[...] = jnp.zeros(TILE, jnp.float32)

  @pl.loop(0, rounds)
  def _round(r):
    mine_s[...] = jnp.zeros(TILE, jnp.float32) + (r * blocks + g).astype(jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(mine_s, board_g.at[jax.lax.rem(r, 2), g])
    plgpu.wait_smem_to_gmem(0)
    if sync is not None:
      sync.arrive()
      sync.wait(r + 1)
    plgpu.copy_gmem_to_smem(board_g.at[jax.lax.rem(r, 2), neighbour], seen_s, bars.at[0])
    plgpu.barrier_wait(bars.at[0])
    wanted = (r * blocks + neighbour).astype(jnp.float32)
    difference = seen_s[...] - wanted
    stale_s[...] = stale_s[...] + difference * difference

  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(stale_s, stale_g.at[g])
  plgpu.wait_smem_to_gmem(0)


def barrier_rounds(blocks: int, rounds: int, mode: str = 'persistent', interpret: Any = None):
  """A jitted function of nothing returning every block's stale sum, (G, 64,
  8) float32, after `rounds` rounds of G blocks in `mode` ('persistent',
  'unfenced' or 'no_barrier'; interpreted, one block)."""
  check_mode(mode)
  if mode == 'per_step':
    raise ValueError("mode='per_step' launches a kernel a step: it has no barrier to time")
  check_blocks_run(blocks, mode, interpret)
  body = functools.partial(_body, blocks=blocks, rounds=rounds, mode=mode)
  kernel = plgpu.kernel(
    body,
    out_type=(
      jax.ShapeDtypeStruct((blocks, *TILE), jnp.float32),
      jax.ShapeDtypeStruct((2, blocks, *TILE), jnp.float32),
    ),
    scratch_types=[
      plgpu.SMEM(TILE, jnp.float32),
      plgpu.SMEM(TILE, jnp.float32),
      plgpu.SMEM(TILE, jnp.float32),
      plgpu.Barrier(num_barriers=1),
    ],
    grid=(blocks,),
    grid_names=('blocks',),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret,
  )
  return jax.jit(lambda: kernel()[0])
