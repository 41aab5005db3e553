"""Tuning studies with real (few-step) training trials: the best trial's config
trains to the same score again (what one trial does: test_tuning_objectives.py),
two worker processes share one study without running a trial twice, and a
killed worker's trial is failed, retried from its checkpoints, and the study
goes on. The workers share the study in SQLite and in a real PostgreSQL server
(skipped, saying why, where none is installed); a killed worker's trial is
failed through the same optuna RDB storage in either, so that runs in SQLite."""

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from conftest import REPO, load_experiment
from postgres_server import find_server, new_database, postgres_server
from tiny_tuning import load_tune_config, write_tune_file

from lm_zoo.errors import ConfigError
from lm_zoo.runs import load_config
from lm_zoo.training import train_and_evaluate
from lm_zoo.tuning import open_study, run_worker, trial_workdir, write_report
from lm_zoo.tuning.study import validate_tuning


@pytest.fixture
def tune_file(tmp_path, data_dir):
  return write_tune_file(tmp_path, data_dir)


def _worker(tune_file, workdir, *flags) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, 'launch/tune.py', f'--tune={tune_file}', f'--workdir={workdir}', *flags],
    cwd=REPO,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _wait_for_checkpoint(worker: subprocess.Popen, tmp_path):
  """The first trial's checkpoint folder, once it holds a committed
  checkpoint (orbax writes a temporary folder, then renames it to the step)."""
  checkpoints = tmp_path / 'trials' / 'tiny' / 'trial_0000' / 'checkpoints'
  deadline = time.monotonic() + 120
  while not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
    assert time.monotonic() < deadline and worker.poll() is None, worker.stdout.read()
    time.sleep(0.05)
  return checkpoints


@pytest.fixture(scope='session')
def postgres():
  """A PostgreSQL server for the session: the URL of its default database."""
  binaries, why = find_server()
  if binaries is None:
    pytest.skip(why)
  with postgres_server(binaries) as url:
    yield url


@pytest.fixture(params=['sqlite', 'postgresql'])
def database(request, tmp_path):
  """The study's `study.storage`: '' (SQLite in the tuning folder) or a new
  PostgreSQL database."""
  if request.param == 'sqlite':
    return ''
  return new_database(
    request.getfixturevalue('postgres'), f'study_{tmp_path.name.lower()}'.replace('-', '_')[:60]
  )


def _trials(study, state):
  return study.get_trials(deepcopy=False, states=(state,))


def test_a_study_completes_and_its_best_config_trains_to_its_score(tune_file, tmp_path):
  tune = load_tune_config(tune_file)
  study = run_worker(tune, tmp_path / 'study')
  complete = _trials(study, optuna.trial.TrialState.COMPLETE)
  assert len(complete) == 3 == len(study.trials)
  best = study.best_trial
  run_dir = trial_workdir(tmp_path / 'study', 'tiny', best)
  assert best.user_attrs['workdir'] == str(run_dir)
  config = load_config(run_dir)  # what experiments/from_workdir.py reads
  assert config.optimizer.learning_rate == pytest.approx(best.params['learning_rate'])
  assert config.model.dropout_input == pytest.approx(best.params['input_dropout'])
  again = train_and_evaluate(config, tmp_path / 'again', final_splits=('valid',))
  assert again['valid']['loss'] == pytest.approx(best.value, rel=1e-6)
  # Each validation turn reached the study.
  assert set(best.intermediate_values) == {10, 20}
  report = write_report(study, tune, tmp_path / 'study')
  assert f'Best: trial {best.number}, valid loss {best.value:.4f}' in report
  assert (tmp_path / 'study' / 'parallel_coordinates.png').stat().st_size > 0


def test_the_study_database_is_in_a_work_directory_whose_name_a_url_would_misread(
  tune_file, tmp_path
):
  workdir = tmp_path / 'a?b #c %20'  # '?' began the URL's query: the database was tmp_path/a
  before = set(tmp_path.iterdir())
  open_study(load_tune_config(tune_file), workdir)
  assert set(tmp_path.iterdir()) - before == {workdir}
  assert (workdir / 'study.db').stat().st_size > 0


@pytest.mark.parametrize('linked', ['study.db', 'trials'])
def test_a_link_inside_the_work_directory_is_refused_before_anything_is_written(
  tune_file, tmp_path, linked
):
  outside = tmp_path / 'outside'
  outside.mkdir()
  workdir = tmp_path / 'tuning'
  workdir.mkdir()
  os.symlink(outside / linked, workdir / linked)
  with pytest.raises(
    ConfigError,
    match=f'{linked} is a symbolic link: lm_zoo writes nothing '
    'through links inside a work directory',
  ):
    open_study(load_tune_config(tune_file), workdir)
  assert not list(outside.iterdir())


def test_workers_must_share_the_search_space(tune_file, tmp_path):
  tune = load_tune_config(tune_file)
  open_study(tune, tmp_path)
  tune.space.learning_rate.high = 0.1
  with pytest.raises(ConfigError, match='another search space'):
    open_study(tune, tmp_path)


def _sampled(tune, workdir, trials: int) -> list[dict]:
  """Opens the study as a (re)started worker does and samples `trials`
  trials of it, each told a made-up loss."""
  from lm_zoo.tuning import suggest

  study = open_study(tune, workdir)
  values = []
  for _ in range(trials):
    trial = study.ask()
    values.append(suggest(trial, tune.space))
    study.tell(trial, values[-1]['learning_rate'])
  return values


def test_a_seeded_study_is_reproducible_and_a_restart_does_not_repeat_it(tune_file, tmp_path):
  tune = load_tune_config(tune_file)
  tune.study.sampler = 'random'
  first, restarted = _sampled(tune, tmp_path / 'a', 3), _sampled(tune, tmp_path / 'a', 3)
  assert all(a != b for a, b in zip(first, restarted)), 'the restart repeated the study'
  again = _sampled(tune, tmp_path / 'b', 3) + _sampled(tune, tmp_path / 'b', 3)
  assert again == first + restarted  # the same seed and history, the same values


def test_two_workers_share_one_study_and_run_no_trial_twice(tune_file, tmp_path, database):
  workers = [
    _worker(
      tune_file,
      tmp_path,
      f'--worker={k}',
      '--tune.study.num_trials=4',
      f'--tune.study.storage={database}',
    )
    for k in (0, 1)
  ]
  outputs = [w.communicate(timeout=300)[0] for w in workers]
  assert [w.returncode for w in workers] == [0, 0], outputs
  tune = load_tune_config(tune_file)
  tune.study.num_trials, tune.study.storage = 4, database
  study = open_study(tune, tmp_path)
  finished = [
    t
    for t in study.trials
    if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
  ]
  assert len(finished) == 4
  # A trial that started at the same moment as the last one was dropped before training.
  others = [t for t in study.trials if t not in finished]
  assert all(t.user_attrs.get('surplus') for t in others)
  workdirs = [t.user_attrs['workdir'] for t in finished]
  assert len(set(workdirs)) == 4
  for workdir in workdirs:  # each trained once, from scratch: 20 steps logged once
    steps = [
      json.loads(line)['step']
      for line in open(f'{workdir}/metrics.jsonl')
      if json.loads(line)['kind'] == 'train'
    ]
    assert steps == [10, 20]
  ran = [
    line
    for out in outputs
    for line in out.splitlines()
    if 'Trial' in line and 'finished with value' in line
  ]
  assert len(ran) == 4


def test_a_killed_workers_trial_fails_and_is_retried_from_its_checkpoint(tune_file, tmp_path):
  # 200 steps, a checkpoint every 50: after the first, the worker is killed
  # long before its trial ends, and the survivor has 150 steps to train.
  flags = (
    '--tune.base.train.max_steps=200',
    '--tune.base.train.checkpoint_every=50',
    '--tune.base.train.eval_every=100',
    '--tune.study.num_trials=1',
    '--tune.study.grace_period=3',
  )
  killed = _worker(tune_file, tmp_path, *flags)
  checkpoints = _wait_for_checkpoint(killed, tmp_path)
  os.kill(killed.pid, signal.SIGKILL)
  killed.wait()
  killed.stdout.close()
  tune = load_tune_config(tune_file)
  tune.base.train.update(max_steps=200, checkpoint_every=50, eval_every=100)
  tune.study.num_trials, tune.study.grace_period = 1, 3
  study = open_study(tune, tmp_path)
  assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING]
  time.sleep(tune.study.grace_period + 1)  # its heartbeat goes stale
  survivor = _worker(tune_file, tmp_path, *flags, '--worker=1')
  output = survivor.communicate(timeout=300)[0]
  assert survivor.returncode == 0, output
  failed, retry = sorted(study.trials, key=lambda t: t.number)
  assert failed.state == optuna.trial.TrialState.FAIL
  assert retry.system_attrs['failed_trial'] == 0
  assert retry.state == optuna.trial.TrialState.COMPLETE
  assert retry.params == failed.params
  assert retry.user_attrs['workdir'] == str(checkpoints.parent)
  assert 'Resumed from step' in output
  assert retry.user_attrs['steps'] == 200


def test_sigterm_checkpoints_the_trial_and_queues_it_again(tune_file, tmp_path):
  flags = (
    '--tune.base.train.max_steps=200',
    '--tune.base.train.checkpoint_every=5',
    '--tune.study.num_trials=1',
  )
  worker = _worker(tune_file, tmp_path, *flags)
  _wait_for_checkpoint(worker, tmp_path)
  worker.send_signal(signal.SIGTERM)
  output = worker.communicate(timeout=120)[0]
  assert worker.returncode == 128 + signal.SIGTERM, output
  assert 'stopped: SIGTERM received' in output
  tune = load_tune_config(tune_file)
  tune.base.train.update(max_steps=200, checkpoint_every=5)
  tune.study.num_trials = 1
  stopped, queued = sorted(open_study(tune, tmp_path).trials, key=lambda t: t.number)
  assert stopped.state == optuna.trial.TrialState.FAIL
  assert queued.state == optuna.trial.TrialState.WAITING
  assert queued.system_attrs['failed_trial'] == 0 and queued.params == stopped.params


@pytest.mark.parametrize('field', ['heartbeat_interval', 'grace_period'])
@pytest.mark.parametrize('value', [0, True])  # a float the config's type refuses
def test_a_tuning_study_s_seconds_must_be_whole_numbers(field, value):
  tune = load_experiment('tune_ptb_small', 'lstm')
  tune.study[field] = value
  with pytest.raises(ConfigError, match=f'tune.study.{field}={value!r} must be a whole number'):
    validate_tuning(tune)


def test_a_report_of_a_study_that_read_lm_zoo_data_opens_the_same_study(tmp_path, data_dir):
  """A study whose base config names no data folder reads $LM_ZOO_DATA, and
  records the folder in its base config: --report_only opens it as it was."""
  tune_file = write_tune_file(tmp_path, '')
  command = [sys.executable, 'launch/tune.py', f'--tune={tune_file}', f'--workdir={tmp_path}/s']
  env = {**os.environ, 'LM_ZOO_DATA': str(data_dir)}
  trained = subprocess.run(
    [*command, '--tune.study.num_trials=1'], cwd=REPO, env=env, capture_output=True, text=True
  )
  assert trained.returncode == 0, trained.stderr[-2000:]
  report = subprocess.run(
    [*command, '--report_only'], cwd=REPO, env=env, capture_output=True, text=True
  )
  assert report.returncode == 0, report.stderr[-2000:]
  assert 'Best: trial 0' in (tmp_path / 's' / 'report.md').read_text()
