"""retain_host_memory: with it a jitted step stops faulting its buffers in;
environment: what a run's numbers depend on beyond its config."""

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from conftest import users_compile_env

from lm_zoo import runtime

# A jitted step whose buffers (40 MiB each) glibc would otherwise map fresh at
# every call; prints whether the settings applied and the median of the minor
# page faults of calls 10 to 29, each counted alone. The heaps settle within
# the first few calls, but a loaded machine (CI's 2 cores under pytest-xdist)
# sometimes grows one late, and that growth faults its pages in once: the
# median leaves out such a call, where a mean over a few calls did not.
PROGRAM = """
import resource, statistics, sys
from lm_zoo.runtime import retain_host_memory
applied = retain_host_memory() if sys.argv[1] == 'retain' else False
import jax, jax.numpy as jnp
step = jax.jit(lambda x: jnp.cumsum(jnp.tanh(x) * 2.0) + x[::-1])
x = jnp.ones(10 * 2 ** 20)
faults = []
for call in range(30):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  jax.block_until_ready(step(x))
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, statistics.median(faults[10:]))
"""


def _faults_per_call(mode: str) -> tuple[str, float]:
  # Compiled as users compile it: without LLVM's optimisations (conftest's
  # setting for the tests' tiny programs) the 60 steps on 10M numbers take minutes.
  out = subprocess.run(
    [sys.executable, '-c', PROGRAM, mode],
    capture_output=True,
    text=True,
    check=True,
    env=users_compile_env(),
  ).stdout.split()
  return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc only')
def test_retained_memory_stops_the_page_faults_of_each_step():
  applied, retained = _faults_per_call('retain')
  _, system = _faults_per_call('system')
  assert applied == 'True'
  pages = 40 * 2**20 // 4096
  assert system > pages  # each call maps at least one buffer afresh
  assert retained < system / 5


def test_opt_out_leaves_malloc_alone(monkeypatch):
  monkeypatch.setenv(runtime.OPT_OUT, '1')
  assert not runtime.retain_host_memory()


@pytest.mark.parametrize(
  'plugin, platforms, expected',
  [
    (None, '', False),
    ('jax_cuda12_plugin', '', True),
    ('libtpu', '', True),
    ('jax_cuda12_plugin', 'cpu', False),
    (None, 'cuda', True),
    (None, 'tpu,cpu', True),
  ],
)
def test_the_cpu_malloc_settings_stay_off_where_a_gpu_or_tpu_runs(
  plugin, platforms, expected, monkeypatch
):
  """An installed GPU or TPU plugin (or JAX_PLATFORMS naming one first) means
  the arrays live on the device: malloc is left alone."""
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util,
    'find_spec',
    lambda name, *a: object() if name == plugin else find_spec(name, *a),
  )
  monkeypatch.setenv('JAX_PLATFORMS', platforms)
  monkeypatch.delenv(runtime.OPT_OUT, raising=False)
  assert runtime.accelerator_expected() == expected
  mallopt_calls = []
  monkeypatch.setattr(runtime.ctypes, 'CDLL', lambda _: _Libc(mallopt_calls))
  assert runtime.retain_host_memory() == (not expected)
  assert bool(mallopt_calls) == (not expected)


class _Libc:
  """glibc as retain_host_memory sees it, recording mallopt's calls."""

  def __init__(self, calls):
    self.calls = calls

  def gnu_get_libc_version(self):
    return b'2.36'

  def mallopt(self, parameter, value):
    self.calls.append((parameter, value))
    return 1


def test_the_cpu_layout_of_bfloat16_products_is_for_the_cpu_only(monkeypatch):
  """On a GPU or TPU the weight-gradient product is the plain einsum: the
  transposes that help XLA's CPU backend would only cost there."""
  from lm_zoo.layers import products

  a, b = jnp.ones((3, 4)), jnp.ones((3, 5))

  def primitives():
    jaxpr = jax.make_jaxpr(lambda a, b: products.contract('ti,tj->ij', a, b, jnp.bfloat16))(a, b)
    return {e.primitive.name for e in jaxpr.eqns}

  assert 'layout_constraint' in primitives()
  for backend in ('gpu', 'tpu'):
    monkeypatch.setattr(products.jax, 'default_backend', lambda: backend)
    assert primitives() == {'convert_element_type', 'dot_general'}


@pytest.mark.skipif(not hasattr(os, 'sched_setaffinity'), reason='CPU affinity is Linux only')
def test_environment_counts_the_cores_this_process_may_use():
  # Pinned to one core (as `taskset -c 0` does), XLA gets one thread.
  program = (
    'import os; os.sched_setaffinity(0, {0}); from lm_zoo.runtime import environment; '
    'e = environment(); print(e["cpu_threads"], e["backend"], e["devices"])'
  )
  out = subprocess.run(
    [sys.executable, '-c', program],
    capture_output=True,
    text=True,
    check=True,
    env={**os.environ, 'XLA_FLAGS': ''},
  ).stdout.split()
  assert out == ['1', 'cpu', '1']
  env = runtime.environment()
  assert env['cpu_threads'] == len(os.sched_getaffinity(0))
  assert env['jax'] == jax.__version__


def test_environment_names_the_cpu_and_the_extensions_xla_chooses_by(tmp_path, monkeypatch):
  # Two hosts' /proc/cpuinfo (the first core's lines; later cores repeat them).
  xeon = (
    'processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n'
    'flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile\n\n'
    'processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n'
  )
  zen = (
    'processor\t: 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n'
    'flags\t\t: fpu avx2 avx fma avx512f avx512_bf16 avx512_vnni\n'
  )
  for text, expected in [
    (
      xeon,
      (
        'Intel(R) Xeon(R) Processor',
        ['avx', 'avx2', 'fma', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile'],
      ),
    ),
    (
      zen,
      (
        'AMD EPYC 9R14 96-Core Processor',
        ['avx', 'avx2', 'fma', 'avx512f', 'avx512_bf16', 'avx512_vnni'],
      ),
    ),
  ]:
    (tmp_path / 'cpuinfo').write_text(text)
    monkeypatch.setattr(runtime, 'CPUINFO', tmp_path / 'cpuinfo')
    assert runtime.cpu() == expected
  monkeypatch.setattr(runtime, 'CPUINFO', tmp_path / 'absent')
  monkeypatch.setattr(runtime.platform, 'processor', lambda: 'arm')
  assert runtime.cpu() == ('arm', [])
  env = runtime.environment()
  assert (env['cpu'], env['cpu_extensions']) == ('arm', [])
