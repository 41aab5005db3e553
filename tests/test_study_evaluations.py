"""A study's evaluations with several workers: each run's evaluation is
scored by one worker (its lock), the others read it back; a worker that
stops before writing leaves the run to the next. The real scoring is
tests/test_seeds.py's; here evaluate_workdirs is replaced by a recorder."""

import json
import math
import subprocess
import sys

import ml_collections
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
  scores = study_evaluations._scores(workdirs, ['lstm'] * 3, 'dyn', evaluation)
  worker.wait(timeout=30)
  # This worker scored runs 0 and 2 (together with members 0), waited for the
  # other to finish run 1, and read its scores back without scoring it.
  assert calls == ([[0], [2]] if members == 1 else [[0, 2]])
  assert [s['test']['perplexity'] for s in scores] == pytest.approx([10.0, 99.0, 12.0])
  for workdir in workdirs:
    assert (workdir / study_evaluations.FOLDER / 'dyn.lock').is_file()


@pytest.mark.parametrize('members', [1, 0])
def test_a_worker_holds_the_locks_of_the_runs_it_is_scoring_only(recorder, monkeypatch, members):
  """So another worker takes the next run meanwhile (flock: a second open
  file of this process is refused as another process would be)."""
  workdirs, calls, _ = recorder
  evaluate, held_while_scoring = study_evaluations.evaluate_workdirs, []

  def noting_the_held_locks(batch, evaluation):
    held = []
    for i, workdir in enumerate(workdirs):
      lock = workdir / study_evaluations.FOLDER / 'dyn.lock'
      if not lock.parent.is_dir():
        continue  # not taken yet
      try:
        with file_lock(lock, False, '{holder}'):
          pass
      except WorkdirInUse:
        held.append(i)
    held_while_scoring.append(held)
    return evaluate(batch, evaluation)

  monkeypatch.setattr(study_evaluations, 'evaluate_workdirs', noting_the_held_locks)
  evaluation = evaluation_config('dynamic')
  evaluation.dynamic.members = members
  study_evaluations._scores(workdirs, ['lstm', 'wider', 'lstm'], 'dyn', evaluation)
  batches = [[0], [1], [2]] if members == 1 else [[0, 2], [1]]
  assert calls == batches and held_while_scoring == batches


def test_a_run_whose_worker_stopped_without_its_scores_is_scored_here(recorder):
  workdirs, calls, release = recorder
  evaluation = evaluation_config('static')
  worker = _other_worker(workdirs[0] / study_evaluations.FOLDER / 'static.json', release, '')
  scores = study_evaluations._scores(workdirs, ['lstm'] * 3, 'static', evaluation)
  worker.wait(timeout=30)
  assert calls == [[1], [2], [0]]
  assert [s['valid']['perplexity'] for s in scores] == pytest.approx([10.0, 11.0, 12.0])
  # Kept: a study run again reads every score back.
  assert study_evaluations._scores(workdirs, ['lstm'] * 3, 'static', evaluation) == scores
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


def _evaluations(**evaluations):
  return ml_collections.ConfigDict({'evaluations': evaluations})


@pytest.mark.parametrize(
  'evaluations, message',
  [
    ('st', 'config.evaluations must map names to evaluation configs, got a str'),
    ({'x' * 101: {'evaluator': 'static'}}, 'is not a name of 1 to 100 letters'),
    (
      {'dyn': {'evaluator': 'dynamic', 'max_token': 3, 'dynamic': {'learnig_rate': (1.0,)}}},
      'config.evaluations.dyn has fields an evaluation config lacks: max_token, '
      'dynamic.learnig_rate: check their spelling',
    ),
    ({'st': {'evaluator': 'static', 'max_tokens': 2.5}}, "config.evaluations.st: .*'max_tokens'"),
    ({'st': {'evaluator': 'static', 'splits': ()}}, 'config.evaluations.st: splits is empty'),
    ({'st': {'evaluator': 'static', 'splits': ('bogus',)}}, "st: splits: unknown split 'bogus'"),
    (
      {'st': {'evaluator': 'static', 'static': {'temperature': 0.0}}},
      'config.evaluations.st: static.temperature must be a positive number',
    ),
    (
      {'mc': {'evaluator': 'mc_dropout', 'mc_dropout': {'samples': 0}}},
      'config.evaluations.mc: mc_dropout.samples must be a whole number >= 1',
    ),
  ],
)
def test_a_bad_evaluation_of_a_study_is_named_before_any_run(evaluations, message):
  config = ml_collections.ConfigDict({'evaluations': evaluations})
  with pytest.raises(ConfigError, match=message):
    study_evaluations.study_evaluations(config)


def test_an_evaluation_that_sets_some_fields_takes_the_defaults_of_the_others():
  checked = study_evaluations.study_evaluations(
    _evaluations(dyn={'evaluator': 'dynamic', 'max_tokens': 30, 'dynamic': {'members': 0}})
  )
  expected = evaluation_config('dynamic')
  expected.max_tokens, expected.dynamic.members = 30, 0
  assert checked['dyn'].to_dict() == expected.to_dict()


def _planted(workdir, what):
  """A run's study_evaluations made hostile: (the path to refuse, a folder
  outside the run that must stay empty)."""
  folder = workdir / study_evaluations.FOLDER
  outside = workdir.parent / f'outside_{what}'
  outside.mkdir()
  if what == 'folder link':
    workdir.mkdir()
    folder.symlink_to(outside, target_is_directory=True)
    return folder, outside
  if what == 'folder a file':
    workdir.mkdir()
    folder.write_text('')
    return folder, outside
  folder.mkdir(parents=True)
  target = folder / ('st.lock' if what == 'lock a folder' else 'st.json')
  if what == 'scores link':
    target.symlink_to(outside / 'st.json')
  else:
    target.mkdir()
  return target, outside


@pytest.mark.parametrize(
  'what, kind',
  [
    ('folder link', 'a symbolic link'),
    ('folder a file', 'a file'),
    ('scores link', 'a symbolic link'),
    ('scores a folder', 'a folder'),
    ('lock a folder', 'a folder'),
  ],
)
def test_scores_are_never_kept_through_a_link_or_in_a_thing_of_another_kind(recorder, what, kind):
  workdirs, calls, _ = recorder
  refused, outside = _planted(workdirs[1], what)
  with pytest.raises(ConfigError, match=f'^{refused} is {kind}, where a study keeps its scores'):
    study_evaluations._scores(workdirs, ['lstm'] * 3, 'st', evaluation_config('static'))
  assert calls == [] and not any(outside.iterdir())


@pytest.mark.parametrize(
  'stored',
  [
    [1, 2],
    None,
    {'scores': {}},
    {'config': 'WANTED'},
    {'config': 'WANTED', 'scores': []},
    {'config': 'WANTED', 'scores': {'valid': {'perplexity': 9.0}}},
    {'config': 'WANTED', 'scores': {'valid': {'perplexity': 9.0}, 'test': {'perplexity': 'abc'}}},
  ],
)
def test_damaged_kept_scores_are_named_with_what_to_do(recorder, stored):
  workdirs, calls, _ = recorder
  evaluation = evaluation_config('static')
  if isinstance(stored, dict) and stored.get('config') == 'WANTED':
    stored['config'] = study_evaluations._scoring_config(evaluation)
  path = workdirs[0] / study_evaluations.FOLDER / 'st.json'
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(stored))
  with pytest.raises(ConfigError, match=f'^{path} .*: delete it to score the run again$'):
    study_evaluations._scores(workdirs, ['lstm'] * 3, 'st', evaluation)
  assert calls == []


def test_scores_of_another_config_are_scored_again(recorder):
  workdirs, calls, _ = recorder
  path = workdirs[0] / study_evaluations.FOLDER / 'st.json'
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps({'config': {'evaluator': 'mc_dropout'}, 'scores': {}}))
  study_evaluations._scores(workdirs, ['lstm'] * 3, 'st', evaluation_config('static'))
  assert calls == [[0], [1], [2]]


def test_a_model_whose_evaluation_fails_leaves_the_other_models_scores_kept(recorder):
  from lm_zoo.errors import DataError

  workdirs, calls, _ = recorder
  evaluate = study_evaluations.evaluate_workdirs

  def failing_for_wider(batch, evaluation):
    if workdirs[2] in batch:
      raise DataError('a stream of 401 tokens is too short for batch size 500')
    return evaluate(batch, evaluation)

  study_evaluations.evaluate_workdirs = failing_for_wider  # undone by the recorder's monkeypatch
  evaluation = evaluation_config('dynamic')
  evaluation.dynamic.members = 0
  with pytest.raises(DataError):
    study_evaluations._scores(workdirs, ['lstm', 'lstm', 'wider'], 'dyn', evaluation)
  assert calls == [[0, 1]]
  kept = [(w / study_evaluations.FOLDER / 'dyn.json').is_file() for w in workdirs]
  assert kept == [True, True, False]


def test_the_report_counts_a_diverged_evaluation_and_averages_the_others():
  rows = [
    {'model': 'lstm', 'seed': s, 'rms_valid_perplexity': p, 'rms_valid_static_perplexity': 100.0}
    for s, p in enumerate([90.0, math.inf, 94.0])
  ]
  report = study_evaluations.evaluations_report(rows, ['rms'])
  assert '| lstm | rms | 3 (1 diverged) | valid | 100.00 ± 0.00 | 92.00 ± 2.83 | 8.00 ± 2.83 |' in (
    report
  )
