"""Process-wide settings that JAX on a CPU host needs to run at full speed."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import pathlib
import platform

import jax
import jaxlib

_log = logging.getLogger(__name__)

# mallopt(3) parameters of glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_LARGEST_INT = 2**31 - 1
OPT_OUT = 'LM_ZOO_SYSTEM_MALLOC'


def retain_host_memory() -> bool:
  """Makes glibc's malloc keep the memory that is freed, for the next step.

  XLA's CPU runtime allocates a computation's buffers at every call. glibc
  returns large blocks (above 128 KiB to 32 MiB, depending on what was freed
  before) and the top of its heaps to the kernel when they are freed, so each
  training step faults all of its buffers in again, page by page, each page
  zeroed by the kernel, a sizeable part of a small model's step on a CPU
  (PyTorch models in the same process lose as much). This serves every block from malloc's heaps
  (M_MMAP_MAX 0), never shrinks them (M_TRIM_THRESHOLD at its largest) and
  gives all threads the main heap (M_ARENA_MAX 1), since a thread's own heap
  is capped at 64 MiB. The process then holds its peak host memory until it
  exits.

  Call it before the first JAX computation: threads started before keep the
  heaps they have. Every lm_zoo program does (`lm_zoo.cli.run`), and so do
  the benchmarks. Setting LM_ZOO_SYSTEM_MALLOC=1 leaves malloc as it is.
  Preloading tcmalloc or jemalloc (LD_PRELOAD) instead has the same effect.
  Where JAX will run on a GPU or TPU (`accelerator_expected`) it is left as
  it is: the buffers live on the device, and the host would hold its peak
  for nothing.

  Returns:
    Whether the settings were applied: False with the opt-out set, a GPU or
    TPU expected, or a C library other than glibc.
  """
  if os.environ.get(OPT_OUT, '') not in ('', '0') or accelerator_expected():
    return False
  libc = ctypes.CDLL(None)
  if not hasattr(libc, 'gnu_get_libc_version'):
    return False
  for parameter, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _LARGEST_INT), (_M_ARENA_MAX, 1)):
    if libc.mallopt(parameter, value) != 1:
      _log.warning('glibc refused mallopt(%d, %d); malloc left as it was', parameter, value)
      return False
  return True


# The packages that give JAX a GPU or TPU backend (pip extras cuda, cuda13, tpu).
ACCELERATOR_PLUGINS = ('jax_cuda12_plugin', 'jax_cuda13_plugin', 'jax_rocm7_plugin', 'libtpu')


def accelerator_expected() -> bool:
  """Whether JAX will pick a GPU or TPU backend: a plugin for one is installed
  and JAX_PLATFORMS does not ask for the CPU. Decided without starting JAX's
  backends, which `retain_host_memory` must precede."""
  platforms = os.environ.get('JAX_PLATFORMS', '') or os.environ.get('JAX_PLATFORM_NAME', '')
  if platforms:
    return platforms.split(',')[0].strip().lower() not in ('cpu', '')
  return any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_PLUGINS)


# The instruction-set extensions among which XLA's CPU kernels choose (the
# vector width, fused multiply-add, bfloat16 dots): another set computes
# another rounding of the same sums.
CPU_EXTENSIONS = (
  'avx',
  'avx2',
  'fma',
  'avx512f',
  'avx512_bf16',
  'avx512_fp16',
  'avx512_vnni',
  'amx_bf16',
  'amx_tile',
)
CPUINFO = pathlib.Path('/proc/cpuinfo')


def cpu() -> tuple[str, list[str]]:
  """This host's CPU model name and which of `CPU_EXTENSIONS` it has, from
  /proc/cpuinfo; elsewhere `platform.processor()` and no extensions."""
  try:
    lines = CPUINFO.read_text().splitlines()
  except OSError:
    return platform.processor() or platform.machine(), []
  fields = {}
  for line in lines:
    key, _, value = line.partition(':')
    fields.setdefault(key.strip(), value.strip())
  flags = set(fields.get('flags', '').split())
  model = fields.get('model name') or platform.processor() or platform.machine()
  return model, [name for name in CPU_EXTENSIONS if name in flags]


def environment() -> dict:
  """What a run's floating-point results depend on beyond its config and
  seed, for its summary: the jax and jaxlib versions, the backend, its
  devices, the CPU (its model and the extensions XLA's kernels choose by:
  the same seed and thread count train to other weights on another CPU) and
  the CPU threads XLA may use (the cores this process may
  run on: XLA sizes its thread pool by them, and a matrix product split over
  another number of threads sums in another order, so one seed trains to
  other weights on 1 core than on 2)."""
  devices = jax.devices()
  threads = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  model, extensions = cpu()
  return {
    'jax': jax.__version__,
    'jaxlib': jaxlib.__version__,
    'backend': jax.default_backend(),
    'devices': len(devices),
    'device_kind': devices[0].device_kind,
    'cpu': model,
    'cpu_extensions': extensions,
    'cpu_threads': threads,
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
  }
