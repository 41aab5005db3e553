"""benchmarks/grid_barrier_probe.py: the barrier's crossings in Pallas' GPU
interpreter (one block round its own slot; two blocks without the barrier
read slots not yet written, which the stale sum must see), and at the
recipe's grid lowered for CUDA with the barrier of each mode."""

import pathlib
import sys

import jax
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from persistent_lowering import FENCE

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'benchmarks'))
from grid_barrier_probe import barrier_rounds  # noqa: E402


def test_one_block_reads_back_every_rounds_tile():
  stale = barrier_rounds(1, 4, 'persistent', plgpu.InterpretGPUParams())()
  assert stale.shape == (1, 64, 8) and not np.any(stale)


def test_without_the_barrier_a_block_reads_a_tile_not_yet_written():
  """Interpreted, the blocks run one after the other: block 0 reads block
  1's slot before block 1 has written it."""
  stale = barrier_rounds(2, 3, 'no_barrier', plgpu.InterpretGPUParams())()
  assert not np.all(np.asarray(stale[0]) == 0)


def test_at_the_recipes_grid_each_mode_lowers_with_its_barrier():
  def lowered(mode):
    return jax.export.export(barrier_rounds(120, 770, mode), platforms=['cuda'])().mlir_module()

  persistent, unfenced, free = (lowered(m) for m in ('persistent', 'unfenced', 'no_barrier'))
  assert 'red.release' in persistent and 'ld.relaxed' in persistent and FENCE in persistent
  assert 'red.release' in unfenced and FENCE not in unfenced
  assert '@mosaic_gpu' in free and 'red.release' not in free


def test_a_mode_without_a_barrier_to_cross_is_refused():
  with pytest.raises(ValueError, match="mode='per_step' launches a kernel a step"):
    barrier_rounds(4, 2, 'per_step')
  with pytest.raises(ValueError, match='mode must be one of'):
    barrier_rounds(4, 2, 'fenced')
