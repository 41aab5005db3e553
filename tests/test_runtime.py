"""retain_host_memory: with it a jitted step stops faulting its buffers in;
environment: what a run's numbers depend on beyond its config."""

import os
import subprocess
import sys

import jax
import pytest

from lm_zoo import runtime

# A jitted step whose buffers (40 MiB each) glibc would otherwise map fresh at
# every call; prints whether the settings applied and the minor page faults of
# the last 5 of 20 calls (the heaps settle within the first few).
PROGRAM = '''
import resource, sys
from lm_zoo.runtime import retain_host_memory
applied = retain_host_memory() if sys.argv[1] == 'retain' else False
import jax, jax.numpy as jnp
step = jax.jit(lambda x: jnp.cumsum(jnp.tanh(x) * 2.0) + x[::-1])
x = jnp.ones(10 * 2 ** 20)
for call in range(20):
  if call == 15:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  jax.block_until_ready(step(x))
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
'''


def _faults_per_call(mode: str, **env) -> tuple[str, float]:
  out = subprocess.run([sys.executable, '-c', PROGRAM, mode], capture_output=True, text=True,
                       check=True, env={**os.environ, **env}).stdout.split()
  return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc only')
def test_retained_memory_stops_the_page_faults_of_each_step():
  applied, retained = _faults_per_call('retain')
  _, system = _faults_per_call('system')
  assert applied == 'True'
  pages = 40 * 2 ** 20 // 4096
  assert system > pages  # each call maps at least one buffer afresh
  assert retained < system / 5


def test_opt_out_leaves_malloc_alone(monkeypatch):
  monkeypatch.setenv(runtime.OPT_OUT, '1')
  assert not runtime.retain_host_memory()


@pytest.mark.skipif(not hasattr(os, 'sched_setaffinity'), reason='CPU affinity is Linux only')
def test_environment_counts_the_cores_this_process_may_use():
  # Pinned to one core (as `taskset -c 0` does), XLA gets one thread.
  program = ('import os; os.sched_setaffinity(0, {0}); from lm_zoo.runtime import environment; '
             'e = environment(); print(e["cpu_threads"], e["backend"], e["devices"])')
  out = subprocess.run([sys.executable, '-c', program], capture_output=True, text=True,
                       check=True, env={**os.environ, 'XLA_FLAGS': ''}).stdout.split()
  assert out == ['1', 'cpu', '1']
  env = runtime.environment()
  assert env['cpu_threads'] == len(os.sched_getaffinity(0))
  assert env['jax'] == jax.__version__
