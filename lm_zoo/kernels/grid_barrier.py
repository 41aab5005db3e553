"""The barrier across the grid of the persistent kernels (`persistent_lstm`,
`persistent_lstm_backward`), and their modes.

At the end of step t every block has written its slice of the state by TMA
(`plgpu.copy_smem_to_gmem`) and waited for those writes
(`plgpu.wait_smem_to_gmem(0)`); it then increments a global semaphore
(`arrive`). Before it reads the whole state of step t, a block waits until
the semaphore reaches (t + 1) G (`wait`): the count only grows (never
decremented; Pallas zeroes the semaphore at each launch), so one semaphore
serves every step. The state crosses memory proxies on its way: the TMA
writes and reads run in the async proxy, the semaphore's atomics in the
generic one, which PTX orders with each other only through a proxy fence.
`fenced` issues `fence.proxy.async.global` after the writes have completed
and again after the wait.

Modes (`MODES`) of a window:
- 'persistent': one launch for the window, the fenced barrier a step;
- 'unfenced': the same without the proxy fences, a probe of what they cost:
  PTX orders the TMA writes with the semaphore only through them, so a
  block may read another's stale values (timing only);
- 'per_step': the kernel launched once a step: the launch boundary is the
  barrier, so it needs no semaphore (and runs in Pallas' GPU interpreter
  with several blocks, which has no semaphores);
- 'no_barrier': one launch without the barrier, whose blocks race ahead:
  wrong answers with several blocks, a probe of what the barrier costs.

Under `jax.vmap` (seeds stacked, MC dropout's samples) the kernels run one
model a launch, in a loop (`one_model_a_launch`): Pallas would batch a
launch by adding the vmapped axis to its grid, and the blocks of every model
would then share one semaphore that counts one model's.

Example (inside a kernel body)::

  sync = grid_barrier(mode, layout.blocks)
  ...
  if sync is not None:
    sync.wait(steps_done)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

MODES = ('persistent', 'unfenced', 'per_step', 'no_barrier')
SYNCED = ('persistent', 'unfenced')  # one launch a window, with the semaphore


def _proxy_fence():
  """`fence.proxy.async.global`: the async proxy's global-memory accesses
  ordered with the generic proxy's (the semaphore's)."""
  from jax._src.lib.mlir import ir  # the Mosaic GPU lowering's MLIR, as inline_mgpu's bodies use
  from jax._src.lib.mlir.dialects import llvm

  @plgpu.inline_mgpu()
  def fence(ctx):
    del ctx
    void = ir.Type.parse('!llvm.void')
    llvm.inline_asm(void, [], 'fence.proxy.async.global;', '', has_side_effects=True)

  fence()


@dataclasses.dataclass(frozen=True)
class GridBarrier:
  """The semaphore of one launch.

  Attributes:
    semaphore: the global semaphore (`pl.get_global`).
    blocks: G, the grid's blocks.
    fenced: whether the proxy fences are issued.
  """

  semaphore: Any
  blocks: int
  fenced: bool

  def arrive(self):
    """After this block's TMA writes of the step have completed."""
    if self.fenced:
      _proxy_fence()
    # The GPU's scope, not the system's: every block is on this one GPU.
    plgpu.semaphore_signal(self.semaphore, memory_scope='gpu')

  def wait(self, steps_done):
    """Until every block has arrived `steps_done` times."""
    done = steps_done * self.blocks
    plgpu.semaphore_wait(self.semaphore, value=done, decrement=False, memory_scope='gpu')
    if self.fenced:
      _proxy_fence()


def grid_barrier(mode: str, blocks: int) -> GridBarrier | None:
  """The barrier of a kernel body launched in `mode` over `blocks` blocks;
  None where it needs none (one block, or a mode without it)."""
  if mode not in SYNCED or blocks == 1:
    return None
  return GridBarrier(pl.get_global(plgpu.SemaphoreType.REGULAR), blocks, mode == 'persistent')


def one_model_a_launch(launch: Callable) -> Callable:
  """`launch` (arrays in, arrays out) run once a model under `jax.vmap`, in
  a loop (`jax.custom_batching.sequential_vmap`), so that every launch's
  grid is one model's: the barrier counts G blocks, and G fit on the SMs."""
  return jax.custom_batching.sequential_vmap(launch)


def check_mode(mode: str):
  if mode not in MODES:
    raise ValueError(f'mode must be one of {", ".join(MODES)}, got {mode!r}')


def check_interpret(interpret: Any, fix: str = '') -> None:
  """Raises ValueError unless `interpret` is None or Mosaic GPU's interpreter
  parameters: the kernels lay their operands out for the GPU only where it
  is None, so `interpret=False` compiled the interpreter's layouts."""
  if interpret is not None and not isinstance(interpret, plgpu.InterpretGPUParams):
    raise ValueError(
      "interpret must be None (compiled for a GPU) or plgpu.InterpretGPUParams() (Pallas' "
      f'Mosaic GPU interpreter), got {interpret!r}{fix}'
    )


def check_blocks_run(blocks: int, mode: str, interpret: Any):
  """Refuses an `interpret` that is neither None nor the interpreter's
  parameters, and a synced grid that cannot run: interpreted (no
  semaphores), or with more blocks than the GPU's SMs (all must be resident,
  or it hangs)."""
  check_interpret(interpret)
  if mode not in SYNCED or blocks == 1:
    return
  if interpret is not None:
    raise ValueError(
      f"mode={mode!r} with blocks={blocks} cannot run interpreted (Pallas' GPU "
      "interpreter has no semaphores): use mode='per_step' or blocks=1"
    )
  device = jax.devices()[0]
  if device.platform == 'gpu' and blocks > device.core_count:
    raise ValueError(
      f'blocks={blocks} exceeds the {device.core_count} SMs of {device.device_kind}: '
      'the persistent grid must be resident at once'
    )
