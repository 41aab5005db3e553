"""A tuning worker killed with SIGKILL inside a trial's checkpoint write,
then the same command run again: the study ends as one never stopped, the
same parameters giving the same score."""

import os
import signal
import subprocess
import sys
import time

import optuna
from conftest import REPO
from tiny_tuning import load_tune_config, write_tune_file

from lm_zoo.runs.checkpoints import ORBAX_TMP
from lm_zoo.tuning import open_study, run_worker

# One trial, a checkpoint every 5 steps; a killed worker's trial is retried
# once its heartbeat is this old.
FLAGS = (
  '--tune.study.num_trials=1',
  '--tune.study.grace_period=3',
  '--tune.base.train.checkpoint_every=5',
)


def _tune(script, tune_file, workdir) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, *script, f'--tune={tune_file}', f'--workdir={workdir}', *FLAGS],
    cwd=REPO,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
    capture_output=True,
    text=True,
    timeout=300,
  )


def _completed(tune, workdir) -> list[optuna.trial.FrozenTrial]:
  return [
    t for t in open_study(tune, workdir).trials if t.state == optuna.trial.TrialState.COMPLETE
  ]


def test_a_worker_killed_inside_a_trial_s_checkpoint_write_reruns_to_the_same_study(
  tmp_path, data_dir
):
  tune_file = write_tune_file(tmp_path, data_dir)
  tune = load_tune_config(tune_file)
  tune.study.num_trials, tune.study.grace_period = 1, 3
  tune.base.train.checkpoint_every = 5
  # The study as it ends when nothing stops it (run in this process: it is
  # the reference, not a program under test).
  run_worker(tune, tmp_path / 'never_stopped')
  # The second checkpoint write of trial 0 (step 10: checkpoint_every=5) is cut.
  killed = _tune(['tests/kill_in_checkpoint.py', '2'], tune_file, tmp_path / 'killed')
  assert killed.returncode == -signal.SIGKILL, killed.stderr
  trial = tmp_path / 'killed' / 'trials' / 'tiny' / 'trial_0000'
  assert any(ORBAX_TMP in path.name for path in trial.rglob('*'))  # killed mid-write
  time.sleep(tune.study.grace_period + 1)  # its heartbeat goes stale
  again = _tune(['launch/tune.py'], tune_file, tmp_path / 'killed')
  assert again.returncode == 0, again.stderr
  assert 'Resumed from step 5' in again.stdout + again.stderr
  [expected], [retried] = (
    _completed(tune, tmp_path / 'never_stopped'),
    _completed(tune, tmp_path / 'killed'),
  )
  assert retried.system_attrs['failed_trial'] == 0
  assert retried.params == expected.params
  assert retried.value == expected.value
  assert retried.user_attrs['steps'] == expected.user_attrs['steps'] == 20
  assert not list(trial.rglob(f'*{ORBAX_TMP}*'))
