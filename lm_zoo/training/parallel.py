"""Data parallelism with `jit` over a device mesh (no `pmap`).

The batch rows (and the recurrent state that belongs to them) are split over
the mesh's 'data' axis; parameters and optimizer state are replicated. XLA
inserts the gradient all-reduce. The same code runs on one device, on many
local devices (GPUs, or CPU devices simulated with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`) and on many hosts:
with `LM_ZOO_DISTRIBUTED=1` in the environment, `initialize_distributed`
calls `jax.distributed.initialize()` (which finds the job on TPU pods and
under SLURM; elsewhere JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID say where) and every host feeds its own slice of each global
batch. The processes share one work directory: process 0 alone
writes its files (`is_main_process`), and the others wait for them where
they read them (`sync_processes`); checkpoints are written by all of them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from lm_zoo.errors import ConfigError

DATA_AXIS = 'data'
DISTRIBUTED_ENV = 'LM_ZOO_DISTRIBUTED'

log = logging.getLogger(__name__)


def initialize_distributed() -> None:
  """Joins a multi-host job when $LM_ZOO_DISTRIBUTED is 1 (before any other
  JAX call). JAX finds the job on TPU pods and under SLURM, and reads
  $JAX_COORDINATOR_ADDRESS; $JAX_NUM_PROCESSES and $JAX_PROCESS_ID, which it
  does not read, are passed on here."""
  if distributed_requested():
    given = {}
    for name, arg in (('JAX_NUM_PROCESSES', 'num_processes'), ('JAX_PROCESS_ID', 'process_id')):
      value = os.environ.get(name, '')
      if value and not value.isdigit():
        raise ConfigError(f'{name}={value!r}: use a whole number (processes count from 0)')
      given[arg] = int(value) if value else None
    jax.distributed.initialize(**given)
    log.info(
      'process %d of %d, %d local of %d devices',
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
    )


def distributed_requested() -> bool:
  """Whether $LM_ZOO_DISTRIBUTED asks to join a multi-host job."""
  return os.environ.get(DISTRIBUTED_ENV, '0') not in ('', '0')


def data_mesh(num_devices: int) -> Mesh | None:
  """A 1-D mesh over the first `num_devices` devices (0: all of them, on
  every host); None for one device, where nothing needs sharding.

  The axis is `Auto`: with explicit axes, gathers from a replicated
  embedding by batch-sharded ids fail to type-check."""
  available = jax.device_count()
  count = available if num_devices == 0 else num_devices
  if not 0 < count <= available:
    raise ConfigError(
      f'parallel.num_devices={num_devices}, but {available} devices are '
      'visible: use a number from 1 to that, or 0 for all'
    )
  if count == 1:
    return None
  return Mesh(np.array(jax.devices()[:count]), (DATA_AXIS,), axis_types=(AxisType.Auto,))


def check_batch(batch_size: int, mesh: Mesh | None, field: str = 'data.batch_size') -> None:
  """Raises ConfigError unless the batch splits evenly over the mesh."""
  if mesh is not None and batch_size % mesh.size:
    raise ConfigError(
      f'{field}={batch_size} does not split over {mesh.size} devices: '
      f'use a multiple of {mesh.size} or set parallel.num_devices'
    )


def state_shardings(state: Any, mesh: Mesh, seed_axis: bool = False) -> Any:
  """Shardings for a `TrainState`: carries split by batch row, the rest
  replicated. With `seed_axis` every leaf has a leading axis of seeds
  (`lm_zoo.training.seed_axis`), and the rows are the carries' second axis."""
  replicated = NamedSharding(mesh, PartitionSpec())
  by_row = NamedSharding(
    mesh, PartitionSpec(None, DATA_AXIS) if seed_axis else PartitionSpec(DATA_AXIS)
  )
  shardings = jax.tree.map(lambda _: replicated, state)
  return shardings.replace(carries=jax.tree.map(lambda _: by_row, state.carries))


def place_state(state: Any, mesh: Mesh | None, seed_axis: bool = False) -> Any:
  """`state` laid out over the mesh by `state_shardings`; without one, on
  the default device, committed there as a step's outputs are: fresh or
  restored arrays in another layout would compile the train step again."""
  if mesh is None:
    return jax.device_put(state, jax.devices()[0])
  return jax.device_put(state, state_shardings(state, mesh, seed_axis))


def shard_batch(mesh: Mesh | None, *arrays: np.ndarray) -> tuple[Any, ...]:
  """Global batch arrays (rows first) split over the mesh's data axis. On
  several hosts each host passes the same global arrays and contributes the
  rows of its own devices."""
  if mesh is None:
    return arrays
  sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  if jax.process_count() == 1:
    return tuple(jax.device_put(a, sharding) for a in arrays)
  rows = sharding.addressable_devices_indices_map(arrays[0].shape)
  first = min(index[0].start or 0 for index in rows.values())
  last = max(index[0].stop or arrays[0].shape[0] for index in rows.values())
  return tuple(
    jax.make_array_from_process_local_data(sharding, a[first:last], a.shape) for a in arrays
  )
