"""Preemption, by breaking runs on purpose: launch/train.py killed with SIGKILL
at random moments and restarted, or stopped by SIGTERM or SIGINT, ends with
the weights of a run that was never stopped, bit for bit."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import REPO, load_experiment

from lm_zoo import cli
from lm_zoo.models import build_model
from lm_zoo.runs import read_metrics
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.training import create_train_state, make_optimizer, train_and_evaluate

# experiments/default.py cut down: 30 windows an epoch, 2 epochs (60 steps,
# an epoch end between), a checkpoint every 5 steps (so the epoch's end saves
# step 30 a second time), a log line every step.
OVERRIDES = {
  'data.train_tokens': 1201,
  'data.valid_tokens': 121,
  'data.test_tokens': 81,
  'data.batch_size': 4,
  'data.bptt': 10,
  'data.eval_batch_size': 2,
  'data.test_batch_size': 2,
  'model.num_layers': 1,
  'model.hidden_size': 16,
  'model.embed_size': 16,
  'train.num_epochs': 2,
  'train.log_every': 1,
  'train.checkpoint_every': 5,
  'generate.num_lines': 0,
}
TOTAL_STEPS = 60


def _config(data_dir):
  config = load_experiment('default')
  config.update_from_flattened_dict({**OVERRIDES, 'data.data_dir': str(data_dir)})
  return config


def _final_state(config, workdir):
  model = build_model(config.model, 10_000)
  like = create_train_state(model, make_optimizer(config.optimizer), config)
  checkpoints = Checkpoints(workdir)
  state, meta = checkpoints.restore_latest(like)
  del meta['train_seconds']  # wall time: differs between runs
  checkpoints.close()
  return state, meta


@pytest.fixture(scope='module')
def uninterrupted(data_dir, tmp_path_factory):
  """(config, final train state, its progress) of the run never stopped."""
  config, workdir = _config(data_dir), tmp_path_factory.mktemp('uninterrupted')
  train_and_evaluate(config, workdir)
  return (config, *_final_state(config, workdir))


@pytest.fixture(scope='module')
def env(data_dir, tmp_path_factory):
  """The training processes' environment: a compilation cache they share, so
  that each restart after the first skips XLA's compile."""
  return {
    **os.environ,
    'LM_ZOO_DATA': str(data_dir),
    'PYTHONUNBUFFERED': '1',
    'JAX_COMPILATION_CACHE_DIR': str(tmp_path_factory.mktemp('jax_cache')),
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
    'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0',
  }


def _start(workdir, env) -> subprocess.Popen:
  flags = [f'--config.{field}={value}' for field, value in OVERRIDES.items()]
  return subprocess.Popen(
    [
      sys.executable,
      'launch/train.py',
      '--config=experiments/default.py',
      f'--workdir={workdir}',
      *flags,
    ],
    cwd=REPO,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )


def _run_to_step(process: subprocess.Popen, target: int) -> list[str]:
  """The log lines up to the one reporting step >= `target` (training goes on)."""
  lines = []
  for line in process.stderr:
    lines.append(line)
    match = re.search(r' step (\d+)/', line)
    if match and int(match.group(1)) >= target:
      return lines
  process.wait()
  pytest.fail(
    f'the run ended (status {process.returncode}) before step {target}:\n' + ''.join(lines[-20:])
  )


def _assert_same_run(uninterrupted, workdir, note=''):
  config, expected, expected_meta = uninterrupted
  state, meta = _final_state(config, workdir)
  assert int(state.step) == int(expected.step) == TOTAL_STEPS, note
  assert meta == expected_meta, note
  # Parameters, optimizer state, carries and key, bit for bit.
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(got, want, err_msg=note)
  # The metrics read as one run: each record once.
  records = read_metrics(workdir / 'metrics.jsonl')
  train_steps = [r['step'] for r in records if r['kind'] == 'train']
  assert train_steps == list(range(1, TOTAL_STEPS + 1)), note
  assert [
    (r['step'], r['epoch']) for r in records if r['kind'] == 'valid' and not r.get('final')
  ] == [(30, 1), (60, 2)], note
  assert [r['kind'] for r in records if r.get('final')] == ['valid', 'test'], note
  assert len(records) == TOTAL_STEPS + 4, note


# ~1 min on 2 cores: five training processes, compiled once.
def test_sigkill_at_random_moments_then_restart_ends_as_if_never_stopped(
  uninterrupted, env, tmp_path
):
  """Kill points drawn as the test runs (the seed is in any failure's
  message): one before the first checkpoint, one in the epoch's end (its
  validation and the second save of step 30), one at a checkpoint step and
  one later, each a random few milliseconds after the step's log line:
  inside an update, a checkpoint write or delete, or a metrics write."""
  seed = random.randrange(2**32)
  rng = random.Random(seed)
  workdir = tmp_path / 'run'
  targets = [
    rng.randint(1, 4),
    rng.randint(29, 30),
    rng.choice(range(35, 56, 5)),
    rng.randint(31, TOTAL_STEPS - 2),
  ]
  note = f'kills after the log lines of steps {targets} (random seed {seed})'
  for target in sorted(targets):
    process = _start(workdir, env)
    _run_to_step(process, target)
    time.sleep(rng.uniform(0, 0.05))
    process.kill()
    process.wait()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL, note
  train_and_evaluate(uninterrupted[0], workdir)  # the last restart finishes
  _assert_same_run(uninterrupted, workdir, note)


def test_sigterm_checkpoints_exits_143_and_the_rerun_resumes(uninterrupted, env, tmp_path):
  workdir = tmp_path / 'run'
  process = _start(workdir, env)
  _run_to_step(process, 17)
  process.send_signal(signal.SIGTERM)
  log = process.stderr.read()
  assert process.wait(timeout=120) == 128 + signal.SIGTERM, log
  assert 'SIGTERM received: saving a checkpoint after this update' in log
  stopped = re.search(r'stopped: SIGTERM received: training stopped at step (\d+)', log)
  assert stopped and 'run the same command to resume' in log, log
  assert 'Traceback' not in log
  step = int(stopped.group(1))
  assert (workdir / 'checkpoints' / str(step)).is_dir()
  assert 'Run summary' not in log  # it stopped, it did not finish
  train_and_evaluate(uninterrupted[0], workdir)
  _assert_same_run(uninterrupted, workdir)


def test_sigint_in_process_stops_with_status_130_and_resumes(
  uninterrupted, tmp_path, monkeypatch, capsys
):
  """Ctrl-C at a known moment: while the 23rd step's metrics are written."""
  write = MetricsWriter.write

  def interrupt_at_step_23(self, kind, **values):
    write(self, kind, **values)
    if kind == 'train' and values['step'] == 23:
      os.kill(os.getpid(), signal.SIGINT)

  monkeypatch.setattr(MetricsWriter, 'write', interrupt_at_step_23)
  config = uninterrupted[0]
  before = signal.getsignal(signal.SIGINT)  # pytest-xdist workers ignore SIGINT
  with pytest.raises(SystemExit) as stopped:
    cli.run(lambda: train_and_evaluate(config, tmp_path))
  assert stopped.value.code == 128 + signal.SIGINT
  assert (
    'stopped: SIGINT received: training stopped at step 23 (epoch 1)' in capsys.readouterr().err
  )
  assert signal.getsignal(signal.SIGINT) is before  # restored
  monkeypatch.undo()
  train_and_evaluate(config, tmp_path)
  _assert_same_run(uninterrupted, tmp_path)


def test_sigint_on_many_processes_is_passed_on_as_sigterm(monkeypatch):
  """With several processes, SIGINT becomes a SIGTERM to this process (the
  signal JAX's preemption notifier tells the others of); SIGTERM itself is
  left alone, and a second SIGINT acts as it would without us."""
  from lm_zoo.runs.preemption import StopRequest

  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  received = []
  record = lambda signum, frame: received.append(signum)
  previous_term = signal.signal(signal.SIGTERM, record)
  previous_int = signal.getsignal(signal.SIGINT)
  try:
    with StopRequest():
      assert signal.getsignal(signal.SIGTERM) is record  # JAX's notifier keeps it
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.1)  # both signals are handled between bytecodes of this thread
      assert received == [signal.SIGTERM]
      assert signal.getsignal(signal.SIGINT) is previous_int
  finally:
    signal.signal(signal.SIGTERM, previous_term)


def test_a_dynamic_evaluation_killed_anywhere_gives_the_same_results_when_run_again(
  data_dir, env, tmp_path
):
  """lm-zoo-eval keeps its choice and each split's result as it goes, each
  written whole: one killed with SIGKILL mid-way, then run again with the
  same command, writes what an evaluation never stopped writes and leaves
  no progress behind."""
  workdir = tmp_path / 'run'
  config = _config(data_dir)
  config.train.num_epochs = 1
  train_and_evaluate(config, workdir)
  command = [
    sys.executable,
    'launch/evaluate.py',
    f'--workdir={workdir}',
    '--config=experiments/dyneval_sgd.py',
    '--config.dynamic.learning_rate=0.01,0.1',
    '--config.dynamic.segment_length=5',
  ]

  def results():
    saved = (workdir / 'evaluations' / 'dynamic.json').read_text()
    return {split: r['loss'] for split, r in json.loads(saved)['results'].items()}

  assert subprocess.run(command, cwd=REPO, env=env, capture_output=True).returncode == 0
  expected = results()
  (workdir / 'evaluations' / 'dynamic.json').unlink()
  killed = subprocess.Popen(
    command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  for line in killed.stdout:  # the search has begun: kill it there
    if 'search' in line or 'valid' in line:
      break
  time.sleep(random.Random(7).uniform(0, 1))
  killed.kill()
  killed.wait()
  killed.stdout.close()
  assert killed.returncode == -signal.SIGKILL  # it was still running
  again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
  assert again.returncode == 0, again.stderr
  assert results() == expected
  assert sorted(p.name for p in (workdir / 'evaluations').iterdir()) == ['dynamic.json']
