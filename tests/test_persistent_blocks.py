"""What every persistent kernel's block shares (lm_zoo.kernels.persistent_blocks):
the columns a block owns, and the shared memory its scratch takes, counted
as Mosaic GPU counts it."""

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.persistent_blocks import block_width, smem_bytes_of, swizzled


def test_a_block_owns_the_fewest_power_of_two_columns_that_tile_the_size():
  """A power of two from 8 (24 or 48 float32 columns would need TMA copies
  of more than 5 strided dimensions), the blocks together covering the size
  in whole swizzle tiles of 32 columns, and no narrower width would."""
  for size in (1, 8, 24, 100, 192, 400, 768, 912, 951, 2048):
    for blocks in (1, 2, 3, 4, 7, 8, 32, 116, 120, 132):
      width = block_width(size, blocks)
      assert width >= 8 and width & (width - 1) == 0
      assert width * blocks >= size and (width * blocks) % 32 == 0
      half = width // 2
      assert width == 8 or half * blocks < size or (half * blocks) % 32
  assert block_width(951, 120) == 8 and block_width(768, 32) == 32  # not 24


def test_shared_memory_counts_each_buffer_in_whole_kibibytes_and_8_bytes_a_barrier():
  """Pallas allocates each buffer at a multiple of 1024 bytes; an mbarrier
  takes 8 (the kernels' own tests check the total against Mosaic's refusal)."""
  scratch = [
    swizzled((64, 32), jnp.bfloat16),  # 4096 bytes
    plgpu.SMEM((64, 8), jnp.float32),  # 2048
    plgpu.SMEM((3, 5), jnp.float32),  # 60 bytes: a whole 1024
    plgpu.Barrier(num_barriers=5),
  ]
  assert smem_bytes_of(scratch) == 4096 + 2048 + 1024 + 8 * 5
  assert smem_bytes_of([plgpu.SMEM((1025,), jnp.int8)]) == 2 * 1024
  assert smem_bytes_of([]) == 0
