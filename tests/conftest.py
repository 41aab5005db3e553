"""Shared fixtures: the real data folder and tiny configs."""

import atexit
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_vjp

from lm_zoo.runtime import accelerator_expected, retain_host_memory

# As lm_zoo's programs do, before any test starts JAX's threads.
retain_host_memory()

# Eight simulated CPU devices for the data-parallel tests; XLA reads the flag
# when jax initialises its backend, so it must be set before any test imports jax.
os.environ['XLA_FLAGS'] = ' '.join(
  filter(None, [os.environ.get('XLA_FLAGS'), '--xla_force_host_platform_device_count=8'])
)

# On a CPU the tests' tiny programs spend far more time in XLA's compiler than
# running. LLVM without its optimisation passes compiles them faster and runs
# the same operations (no fast-math, so the same float rounding). Accelerator
# hosts keep the defaults, which their kernels' tests run as users do.
# LM_ZOO_TEST_COMPILE=default keeps XLA's defaults: for a child process whose
# claim is about the programs users compile (`users_compile_env`).
CPU_COMPILE_FLAGS = ('--xla_backend_optimization_level=0',)
if not accelerator_expected() and os.environ.get('LM_ZOO_TEST_COMPILE') != 'default':
  for flag in CPU_COMPILE_FLAGS:
    if flag.split('=')[0] not in os.environ['XLA_FLAGS']:
      os.environ['XLA_FLAGS'] += ' ' + flag

# The tests compare float32 results with float64 NumPy restatements of the
# equations: on GPUs and TPUs JAX's default float32 products round to TF32 or
# bfloat16 passes (on an H100 test_lstm failed 6 of 16 so, and passed all with
# this), as CPUs never do. jax is imported already (lm_zoo.runtime), so this
# process is told through its config, and subprocesses through the variable.
os.environ.setdefault('JAX_DEFAULT_MATMUL_PRECISION', 'highest')
jax.config.update('jax_default_matmul_precision', os.environ['JAX_DEFAULT_MATMUL_PRECISION'])

# Many tests compile the same tiny models again (each run builds its own jitted
# steps, and the launch tests start fresh processes): a compilation cache
# shared by the test processes (xdist's workers) and their subprocesses.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='lm_zoo_test_jax_cache_')
  atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], True)
# Compilations of 1 s or more are cached: the tests compile the same
# programs again in new closures (each run's initialisation and steps), which
# the in-memory caches miss. Each write runs XLA's executable.serialize(),
# which now and then crashes its process with a segfault or an abort (once
# in the last three full runs at 0.1 s, each of which wrote about 1,200
# entries): at 1 s a run writes under 200, the compilations whose reuse
# saves the most.
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '1.0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
# jax read its variables when lm_zoo.runtime imported it: this process is told
# through its config (before its first compilation, which fixes the cache).
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update(
  'jax_persistent_cache_min_compile_time_secs',
  float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']),
)
jax.config.update(
  'jax_persistent_cache_min_entry_size_bytes',
  int(os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES']),
)

REPO = pathlib.Path(__file__).resolve().parents[1]


def users_compile_env() -> dict[str, str]:
  """This process's environment for a child that compiles as users do,
  without conftest's CPU compile flags."""
  flags = ' '.join(
    flag for flag in os.environ.get('XLA_FLAGS', '').split() if flag not in CPU_COMPILE_FLAGS
  )
  return {**os.environ, 'XLA_FLAGS': flags, 'LM_ZOO_TEST_COMPILE': 'default'}


@pytest.fixture(scope='session')
def data_dir() -> pathlib.Path:
  """$LM_ZOO_DATA, else ../shared/data beside the checkout."""
  path = pathlib.Path(os.environ.get('LM_ZOO_DATA') or REPO.parent / 'shared' / 'data')
  if not (path / 'ptb' / 'train.txt').is_file():
    pytest.fail(
      f'the real datasets are not at {path}: set LM_ZOO_DATA to the '
      'folder holding ptb/, wikitext-2/ and ptb-char/'
    )
  return path


@pytest.fixture
def tiny_config(data_dir):
  """A config that trains in seconds: a few hundred PTB tokens, 2 x 16 LSTM."""
  return tiny_lm_config(data_dir)


def tiny_lm_config(data_dir):
  """`tiny_config`'s config, for fixtures of a wider scope."""
  from lm_zoo.configs import base_config

  c = base_config()
  c.data.data_dir = str(data_dir)
  c.data.batch_size = 4
  c.data.bptt = 10
  c.data.eval_batch_size = 3
  c.data.test_batch_size = 2
  c.data.train_tokens = 401  # 100 steps of 4 rows -> 10 windows an epoch
  # Evaluation rows of 40 tokens, 4 windows each: one window shape a split,
  # so each split's step compiles once.
  c.data.valid_tokens = 121
  c.data.test_tokens = 81
  c.model.embed_size = 16
  c.model.hidden_size = 16
  c.model.dropout_input = 0.2
  c.model.dropout_hidden = 0.2
  c.model.dropout_state = 0.1
  c.model.dropout_output = 0.2
  c.optimizer.learning_rate = 0.5
  c.train.num_epochs = 3
  c.train.log_every = 5
  c.train.checkpoint_every = 7
  c.generate.num_lines = 1
  c.generate.num_tokens = 5
  return c


@pytest.fixture(scope='session')
def trained_workdir(tmp_path_factory, data_dir) -> pathlib.Path:
  """`tiny_lm_config`'s run trained for one epoch, shared: a test may add
  files beside its weights (evaluations, a meta-learner), never change them."""
  from lm_zoo.training import train_and_evaluate

  workdir = tmp_path_factory.mktemp('trained')
  config = tiny_lm_config(data_dir)
  config.train.update(num_epochs=1)
  train_and_evaluate(config, workdir)
  return workdir


# Pallas' Triton lowering compiles for a GPU's compute capability: on a host
# without a GPU it raises unless an abstract GPU is named.
TRITON_TARGET = jax.sharding.AbstractMesh(
  (), (), abstract_device=jax.sharding.AbstractDevice('NVIDIA H100', None, 'gpu')
)


def lower_for_cuda(jitted, *args):
  """`jitted` traced at `args` and lowered for CUDA, its Triton kernels for an
  H100. jax reads the abstract GPU as it traces, not as it lowers."""
  with jax.sharding.use_abstract_mesh(TRITON_TARGET):
    return jitted.trace(*args).lower(lowering_platforms=('cuda',))


def check_reverse_gradient(f, args: tuple, eps: float, atol: float, rtol: float):
  """`jax.test_util.check_grads(f, args, order=1, modes=('rev',))` against f's
  gradient compiled whole by one jax.jit (jax.vjp of a jitted f would compile
  its forward and backward passes as programs of their own): a finite
  difference along a random direction. Returns the gradient, one tree an arg."""
  grads = jax.jit(jax.grad(f, argnums=tuple(range(len(args)))))(*args)
  vjp = lambda *a: (f(*a), lambda ct: jax.tree.map(lambda g: np.asarray(g) * ct, grads))
  check_vjp(f, vjp, args, eps=eps, atol=atol, rtol=rtol)
  return grads


def perturb(params, seed: int = 1, scale: float = 0.3):
  """params plus N(0, scale²) noise, so that zero-initialised biases count too."""
  import jax

  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(
    tree, [x + scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  )


def alstm_window_inputs(cell, batch: int, inputs: int, units: int, steps: int, seed: int = 1):
  """A random carry for `cell` (the latent's too), random inputs (steps,
  batch, inputs) and a state dropout mask (batch, units) at rate 0.3."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(seed)
  normal = lambda shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  carry = jax.tree.map(
    lambda a: normal(a.shape), cell.initialize_carry(jax.random.key(0), (batch, inputs))
  )
  mask = jnp.asarray(rng.binomial(1, 0.7, (batch, units)) / 0.7, jnp.float32)
  return carry, normal((steps, batch, inputs)), mask


def load_experiment(name: str, *args):
  """`get_config(*args)` of experiments/NAME.py, loaded by path as config_flags does."""
  import importlib.util

  path = REPO / 'experiments' / f'{name}.py'
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


def run_script(args, env_extra=None) -> subprocess.CompletedProcess:
  """Runs a repository script as a user would, from the repository root."""
  env = {**os.environ, 'PYTHONUNBUFFERED': '1', **(env_extra or {})}
  return subprocess.run(
    [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
  )


def read_events(logdir):
  """Every event of a TensorBoard log folder, its files in name (time) order
  (their TFRecord framing: length, its crc, the record, its crc)."""
  import struct

  from tensorboardX.proto import event_pb2

  for path in sorted(pathlib.Path(logdir).glob('events.out.tfevents.*')):
    data, offset = path.read_bytes(), 0
    while offset < len(data):
      (length,) = struct.unpack_from('<Q', data, offset)
      yield event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
      offset += 12 + length + 4


def read_scalar_events(logdir) -> dict[str, list[tuple[int, float]]]:
  """The scalars of a TensorBoard log folder as TensorBoard shows them: a
  SessionLog START event at step S drops the scalars at steps >= S read
  before it, as TensorBoard's purge of orphaned data does."""
  scalars: dict[str, list[tuple[int, float]]] = {}
  for event in read_events(logdir):
    if event.HasField('session_log') and event.session_log.status == event.session_log.START:
      scalars = {
        tag: [(s, v) for s, v in points if s < event.step] for tag, points in scalars.items()
      }
    for value in event.summary.value:
      scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


# Holds WORKDIR's lock until the file RELEASE exists, then exits.
HOLDER = """
import pathlib, sys, time
from lm_zoo.runs.workdir import workdir_lock
with workdir_lock(pathlib.Path(sys.argv[1])):
  print('held', flush=True)
  while not pathlib.Path(sys.argv[2]).exists():
    time.sleep(0.05)
"""


def hold_lock(workdir, release) -> subprocess.Popen:
  """A process holding `workdir`'s lock until `release` is created."""
  holder = subprocess.Popen(
    [sys.executable, '-c', HOLDER, str(workdir), str(release)], stdout=subprocess.PIPE, text=True
  )
  assert holder.stdout.readline().strip() == 'held'
  return holder


def loss_and_grads(model, params, tokens, train=False):
  """Mean next-token NLL of `tokens` (B, T) from a zero state, and its gradient."""
  carries = model.initialize_carry(tokens.shape[0])

  def loss(p):
    logits, _ = model.apply(
      {'params': p}, tokens[:, :-1], carries, train=train, rngs={'dropout': jax.random.key(5)}
    )
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, tokens[:, 1:, None], -1))

  return jax.value_and_grad(loss)(params)


@pytest.fixture(scope='session')
def hostile_folders(data_dir, tmp_path_factory):
  """A tiny trained work directory, damaged copies of it and hostile files
  (tests/hostile_programs.py: make_folders)."""
  from hostile_programs import make_folders

  return make_folders(data_dir, tmp_path_factory.mktemp('hostile'))


# --- Shared by the program tests (test_launch, test_bad_command_lines):
# scripts run in forked children of one process. ---


def run_scripts(command_lines, env_extra=None) -> list[subprocess.CompletedProcess]:
  """`run_script` of each command line, each a process of its own forked from
  one that loaded JAX and lm_zoo once (seconds a process): for tests of what
  a script prints and its exit status, not of the interpreter's start."""
  import json

  # Each script as long as `run_script` gives it.
  env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'PROBE_TIME_LIMIT_S': '600', **(env_extra or {})}
  ran = subprocess.run(
    [sys.executable, str(REPO / 'tests' / 'program_probes.py'), '--scripts'],
    cwd=REPO,
    env=env,
    input=json.dumps([list(map(str, args)) for args in command_lines]),
    capture_output=True,
    text=True,
    timeout=600 * len(command_lines),
  )
  assert ran.returncode == 0, ran.stderr
  return [
    subprocess.CompletedProcess(args, r['status'], r['stdout'], r['stderr'])
    for args, r in zip(command_lines, json.loads(ran.stdout))
  ]
