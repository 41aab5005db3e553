"""The set-up of tests/test_hostile_programs.py and test_hostile_tools.py:
hostile files beside a tiny trained work directory, and the programs run on
many command lines, one process a program (tests/program_probes.py)."""

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO
from refusals import TINY, tiny_config

from lm_zoo.training import train_and_evaluate

# The tiny config as --config overrides of experiments/default.py.
TINY_FLAGS = [
  '--config=experiments/default.py',
  *(f'--config.{field}={value}' for field, value in TINY.items()),
]
LONG_PROMPT = '--prompt=' + 'the company ' * 2500


def _damaged(workdir, damage):
  """A copy of `workdir` beside it with `damage(copy)` done."""
  copy = workdir.parent / damage.__name__
  shutil.copytree(workdir, copy)
  damage(copy)
  return copy


def _empty_vocab(w):
  (w / 'vocab.json').write_text('')


def _vocab_of_wrong_shape(w):
  (w / 'vocab.json').write_text('{"tokens": 5}')


def _config_a_list(w):
  (w / 'config.json').write_text('[]')


def _config_a_folder(w):
  (w / 'config.json').unlink()
  (w / 'config.json').mkdir()


def _best_a_file(w):
  shutil.rmtree(w / 'best')
  (w / 'best').write_text('')


def _no_best(w):
  shutil.rmtree(w / 'best')


def _unknown_config_field(w):
  config = json.loads((w / 'config.json').read_text())
  config['model']['hiden_size'] = 3
  (w / 'config.json').write_text(json.dumps(config))


def _unknown_config_section(w):
  config = json.loads((w / 'config.json').read_text())
  config['extras'] = {'note': 1}
  (w / 'config.json').write_text(json.dumps(config))


def _data_json_empty_object(w):
  (w / 'data.json').write_text('{}')


DAMAGES = [
  _empty_vocab,
  _vocab_of_wrong_shape,
  _config_a_list,
  _config_a_folder,
  _best_a_file,
  _no_best,
  _unknown_config_field,
  _unknown_config_section,
  _data_json_empty_object,
]


def _cut_study_database(folder):
  """FOLDER/study.db: an Optuna study of three trials, cut to half its size."""
  import optuna

  folder.mkdir()
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  study = optuna.create_study(storage=f'sqlite:///{folder}/study.db', study_name='cut')
  study.optimize(lambda trial: trial.suggest_float('x', 0, 1), n_trials=3)
  del study
  path = folder / 'study.db'
  with open(path, 'r+b') as f:
    f.truncate(path.stat().st_size // 2)


def make_folders(data_dir, t) -> dict[str, str]:
  """{t}: a folder of hostile files; {w}: a trained work directory beside
  copies of it damaged by DAMAGES (each {t}/NAME); {d}: the data."""
  train_and_evaluate(tiny_config(data_dir), t / 'run')
  for damage in DAMAGES:
    _damaged(t / 'run', damage)
  (t / 'file.txt').write_text('not a folder')
  (t / 'garbled.json').write_text('{"rows": [1, 2')
  (t / 'list.json').write_text('[1, 2, 3]')
  (t / 'test_only.json').write_text('{"segments": {"test": {"nll": [1.0], "tokens": [1]}}}')
  (t / 'syntax.py').write_text('def get_config(:\n')
  (t / 'no_get_config.py').write_text('x = 1\n')
  (t / 'raises.py').write_text('def get_config():\n  return 1 / 0\n')
  (t / 'empty_dir').mkdir()
  _cut_study_database(t / 'cut_study')
  return {'t': str(t), 'w': str(t / 'run'), 'd': str(data_dir)}


def run_probes(probes: dict, folders: dict[str, str]) -> dict[str, dict]:
  """Each probe's {"status", "stdout", "stderr"}: every probe forked from one
  process (JAX and lm_zoo imported once), a program's probes one after
  another, the programs in name order."""
  ids = sorted(probes, key=lambda i: probes[i][0])  # stable: each program's in order
  command_lines = [[probes[i][0], *(arg.format(**folders) for arg in probes[i][1])] for i in ids]
  ran = subprocess.run(
    [sys.executable, 'tests/program_probes.py', '--programs'],
    cwd=REPO,
    input=json.dumps(command_lines),
    capture_output=True,
    text=True,
    timeout=900,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
  )
  assert ran.returncode == 0, ran.stderr
  return dict(zip(ids, json.loads(ran.stdout)))


def check(got: dict, expected: str | None, folders: dict[str, str]) -> None:
  """`got` succeeded (`expected` None) or ended in one error line holding
  `expected` (for a flag, then where to find the flags); never a traceback."""
  assert 'Traceback' not in got['stdout'] + got['stderr']
  if expected is None:
    assert got['status'] == 0, got['stderr']
    return
  lines = got['stderr'].strip().splitlines()
  if lines[-1:] == ['Pass --help to see the flags.']:
    lines.pop()
  assert got['status'] == 1 and lines, got
  assert lines[-1].startswith('error: '), lines
  assert expected.format(**folders) in lines[-1], lines[-1]
