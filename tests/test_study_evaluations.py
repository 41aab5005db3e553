"""A study's evaluations with several workers: each run's evaluation is
scored by one worker (its lock), the others read it back; a worker that
stops before writing leaves the run to the next. The real scoring is
tests/test_seeds.py's; here evaluate_workdirs is replaced by a recorder."""

import json
import math
import subprocess
import sys

import pytest

from lm_zoo.configs import evaluation_config
from lm_zoo.errors import ConfigError, WorkdirInUse
from lm_zoo.evaluation import EvalResult
from lm_zoo.runs.workdir import file_lock
from lm_zoo.tasks import study_evaluations

# Holds the lock argv[1] until argv[2] exists; then writes argv[4] into argv[3]
# (the scores another worker computed) unless argv[4] is empty, and exits.
WORKER = """
import pathlib, sys, time
from lm_zoo.runs.workdir import file_lock
with file_lock(pathlib.Path(sys.argv[1]), False, '{holder}'):
  print('held', flush=True)
  while not pathlib.Path(sys.argv[2]).exists():
    time.sleep(0.05)
  if sys.argv[4]:
    pathlib.Path(sys.argv[3]).write_text(sys.argv[4])
"""


def _other_worker(scores_path, release, written: str) -> subprocess.Popen:
  scores_path.parent.mkdir(parents=True, exist_ok=True)
  lock = scores_path.with_suffix('.lock')
  worker = subprocess.Popen(
    [sys.executable, '-c', WORKER, str(lock), str(release), str(scores_path), written],
    stdout=subprocess.PIPE,
    text=True,
  )
  assert worker.stdout.readline().strip() == 'held'
  return worker


@pytest.fixture
def recorder(monkeypatch, tmp_path):
  """Three work directories and the evaluate_workdirs calls the study makes
  (each run's perplexity 10 + its index; `release` is created once a call
  names the last run)."""
  workdirs = [tmp_path / f'run_{i}' for i in range(3)]
  calls, release = [], tmp_path / 'release'

  def evaluate_workdirs(batch, evaluation):
    calls.append([workdirs.index(w) for w in batch])
    if workdirs[-1] in batch:
      release.touch()
    outcomes = []
    for workdir in batch:
      loss = math.log(10 + workdirs.index(workdir))
      outcomes.append({split: EvalResult(loss, 5, 'word') for split in ('valid', 'test')})
    return outcomes

  monkeypatch.setattr(study_evaluations, 'evaluate_workdirs', evaluate_workdirs)
  return workdirs, calls, release


@pytest.mark.parametrize('members', [1, 0])
def test_a_run_another_worker_scores_is_left_to_it_and_read_back(recorder, members):
  workdirs, calls, release = recorder
  evaluation = evaluation_config('dynamic')
  evaluation.dynamic.members = members
  path = workdirs[1] / study_evaluations.FOLDER / 'dyn.json'
  theirs = {split: {'perplexity': 99.0} for split in ('valid', 'test')}
  written = {'config': study_evaluations._scoring_config(evaluation), 'scores': theirs}
  worker = _other_worker(path, release, json.dumps(written))
  scores = study_evaluations._scores(workdirs, 'dyn', evaluation)
  worker.wait(timeout=30)
  # This worker scored runs 0 and 2 (together with members 0), waited for the
  # other to finish run 1, and read its scores back without scoring it.
  assert calls == ([[0], [2]] if members == 1 else [[0, 2]])
  assert [s['test']['perplexity'] for s in scores] == pytest.approx([10.0, 99.0, 12.0])
  for workdir in workdirs:
    assert (workdir / study_evaluations.FOLDER / 'dyn.lock').is_file()


def test_a_run_whose_worker_stopped_without_its_scores_is_scored_here(recorder):
  workdirs, calls, release = recorder
  evaluation = evaluation_config('static')
  worker = _other_worker(workdirs[0] / study_evaluations.FOLDER / 'static.json', release, '')
  scores = study_evaluations._scores(workdirs, 'static', evaluation)
  worker.wait(timeout=30)
  assert calls == [[1], [2], [0]]
  assert [s['valid']['perplexity'] for s in scores] == pytest.approx([10.0, 11.0, 12.0])
  # Kept: a study run again reads every score back.
  assert study_evaluations._scores(workdirs, 'static', evaluation) == scores
  assert len(calls) == 3


def test_a_held_lock_names_its_holder_and_a_link_is_refused(tmp_path):
  release = tmp_path / 'release'
  worker = _other_worker(tmp_path / 'scores.json', release, '')
  with pytest.raises(WorkdirInUse, match=f'^pid {worker.pid} on host'):
    with file_lock(tmp_path / 'scores.lock', False, '{holder}'):
      pass
  release.touch()
  worker.wait(timeout=30)
  (tmp_path / 'link.lock').symlink_to(tmp_path / 'elsewhere')
  with pytest.raises(ConfigError, match='link.lock is a symbolic link'):
    with file_lock(tmp_path / 'link.lock', True, '{holder}'):
      pass
  assert not (tmp_path / 'elsewhere').exists()
