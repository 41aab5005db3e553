"""Hostile inputs to a work directory: links that would carry lm_zoo's
writes out of it, folders that are not work directories, and files damaged
or swapped. Each is refused in one `error:` line naming the file and what to
do, before anything is written, and what the link points to is untouched."""

import json
import os
import shutil

import pytest
from conftest import run_script
from refusals import tiny_config

import lm_zoo
from lm_zoo import cli
from lm_zoo.configs import meta_training_config
from lm_zoo.runs.finished import load_model
from lm_zoo.runs.workdir import workdir_lock
from lm_zoo.tasks.runs import train_or_read
from lm_zoo.training import evaluate_workdir, meta_train_workdir, train_and_evaluate
from lm_zoo.tuning import param, run_worker, tuning_config


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  """A work directory of one finished epoch (latest and best checkpoints)."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  train_and_evaluate(tiny_config(data_dir), workdir)
  return workdir


def _victim(t):
  victim = t / 'victim.txt'
  victim.write_text('keep me')
  return victim


def _link_lock(d, t, w):
  (w / 'lock').unlink()
  os.symlink(_victim(t), w / 'lock')
  return lambda: train_and_evaluate(tiny_config(d, **{'train.max_steps': 20}), w)


def _link_a_checkpoint(d, t, w):
  os.symlink(t, w / 'checkpoints' / '99')
  return lambda: train_and_evaluate(tiny_config(d, **{'train.max_steps': 20}), w)


def _link_tensorboard(d, t, w):
  shutil.rmtree(w / 'tensorboard', ignore_errors=True)
  os.symlink(t, w / 'tensorboard')
  return lambda: train_and_evaluate(tiny_config(d, **{'train.max_steps': 20}), w)


def _link_the_meta_learner(d, t, w):
  os.symlink(t, w / 'meta_learner')
  config = meta_training_config()
  config.update_from_flattened_dict(
    {
      'meta_steps': 1,
      'fisher_batches': 1,
      'fisher_batch_size': 2,
      'num_updates': 1,
      'segment_length': 5,
      'batch_size': 1,
    }
  )
  return lambda: meta_train_workdir(w, config)


def _edit_json(name, edit):
  def set_up(d, t, w):
    path = w / name
    path.write_text(edit(path.read_text()))
    return lambda: load_model(w)

  return set_up


def _delete(name):
  def set_up(d, t, w):
    (w / name).unlink()
    return lambda: load_model(w)

  return set_up


def _swap_two_tokens(text):
  saved = json.loads(text)
  saved['tokens'][5], saved['tokens'][6] = saved['tokens'][6], saved['tokens'][5]
  return json.dumps(saved)


def _best_meta(edit):
  def set_up(d, t, w):
    step = next((w / 'best').iterdir())
    edit(step)
    return lambda: evaluate_workdir(w)

  return set_up


def _drop_digests(step):
  path = step / 'meta' / 'metadata'
  meta = json.loads(path.read_text())
  del meta['array_digests']
  path.write_text(json.dumps(meta))


def _older_format(name):
  def set_up(d, t, w):
    path = w / name
    saved = json.loads(path.read_text())
    del saved['format_version']
    path.write_text(json.dumps(saved))
    return lambda: evaluate_workdir(w)

  return set_up


def _garble_metrics_line(d, t, w):
  path = w / 'metrics.jsonl'
  lines = path.read_text().splitlines(keepends=True)
  lines[1] = '{"kind": "train", "st\n'
  path.write_text(''.join(lines))
  return lambda: train_and_evaluate(
    tiny_config(d, **{'train.max_steps': 20, 'train.num_epochs': 2}), w
  )


def _damage_summary(d, t, w):
  path = w / 'summary.json'
  path.write_text(path.read_text()[:30])
  return lambda: train_and_evaluate(tiny_config(d), w)


def _tune(corrupt_database=False, **fields):
  """A tuning worker whose tuning config has `fields` set."""

  def set_up(d, t, w):
    tune = tuning_config()
    tune.base = tiny_config(d)
    tune.space.learning_rate = param('optimizer.learning_rate', 1e-3, 1e-2, log=True)
    tune.update_from_flattened_dict(fields)
    if corrupt_database:
      (t / 'tune').mkdir()
      (t / 'tune' / 'study.db').write_bytes(os.urandom(1000))
    return lambda: run_worker(tune, t / 'tune')

  return set_up


def _foreign_folder(d, t, w):
  (t / 'mine').mkdir()
  (t / 'mine' / 'notes.txt').write_text('my notes')
  return lambda: train_and_evaluate(tiny_config(d), t / 'mine')


def _cut(name, job):
  """A set-up that cuts WORKDIR/NAME short, then runs `job(data_dir, workdir)`."""

  def set_up(d, t, w):
    path = w / name
    text = path.read_text() if path.is_file() else '{"seeds": [0, 1]}'
    path.write_text(text[: len(text) // 2])
    return lambda: job(d, w)

  return set_up


# id -> (set-up(data_dir, tmp_path, a copy of the trained work directory) -> job,
#        what the error line says)
CASES = {
  'the lock a link to a file': (
    _link_lock,
    '{w}/lock is a symbolic link: lm_zoo writes nothing through links inside a work directory',
  ),
  'a checkpoint a link': (_link_a_checkpoint, '{w}/checkpoints/99 is a symbolic link'),
  'the TensorBoard folder a link': (_link_tensorboard, '{w}/tensorboard is a symbolic link'),
  'the meta-learner folder a link': (_link_the_meta_learner, '{w}/meta_learner is a symbolic link'),
  'an empty work directory name': (
    lambda d, t, w: lambda: train_and_evaluate(tiny_config(d), ''),
    'the work directory is empty: name a folder',
  ),
  'a work directory that is a file': (
    lambda d, t, w: lambda: train_and_evaluate(tiny_config(d), _victim(t)),
    '--workdir={t}/victim.txt is a file, not a folder',
  ),
  'a folder of other files': (
    _foreign_folder,
    '{t}/mine holds files lm_zoo did not write (notes.txt): train in a new or empty folder',
  ),
  'vocab.json with two tokens swapped': (
    _edit_json('vocab.json', _swap_two_tokens),
    '{w}/vocab.json is not the vocabulary the run trained with',
  ),
  'vocab.json cut short': (
    _edit_json('vocab.json', lambda text: text[: len(text) // 2]),
    '{w}/vocab.json is damaged (JSONDecodeError',
  ),
  'data.json cut short': (
    _edit_json('data.json', lambda text: text[:40]),
    '{w}/data.json is damaged (JSONDecodeError',
  ),
  'data.json deleted': (_delete('data.json'), '{w}/data.json is missing'),
  'a best checkpoint without digests': (
    _best_meta(_drop_digests),
    'is damaged: its meta has no array digests',
  ),
  'a best checkpoint without its metadata': (
    _best_meta(lambda step: (step / 'state' / '_METADATA').unlink()),
    'state/_METADATA is missing; best/ keeps no other copy',
  ),
  'a config.json of an older format': (
    _older_format('config.json'),
    f'was written by lm_zoo {lm_zoo.__version__} (format None)',
  ),
  'a damaged line inside metrics.jsonl': (
    _garble_metrics_line,
    '{w}/metrics.jsonl is damaged at line 2: ',
  ),
  'a damaged summary.json': (_damage_summary, '{w}/summary.json is damaged (JSONDecodeError'),
  "a damaged summary.json of a study's run": (
    _cut('summary.json', lambda d, w: train_or_read(tiny_config(d), w)),
    '{w}/summary.json is damaged (JSONDecodeError',
  ),
  'a damaged seeds.json': (
    _cut('seeds.json', lambda d, w: train_and_evaluate(tiny_config(d), w)),
    '{w}/seeds.json is damaged (JSONDecodeError',
  ),
  'a seed beyond 2**32': (
    lambda d, t, w: lambda: train_and_evaluate(tiny_config(d, seed=10**23), t / 'new'),
    'config field seed=100000000000000000000000 must be in [0, 2**32)',
  ),
  'a hidden size of 2**40': (
    lambda d, t, w: (
      lambda: train_and_evaluate(tiny_config(d, **{'model.hidden_size': 2**40}), t / 'new')
    ),
    'model.hidden_size=1099511627776 must be below 2**31',
  ),
  'a tuning database URL of no known kind': (
    _tune(**{'study.storage': 'bogus://x'}),
    "tune.study.storage='bogus://x' is not a database URL SQLAlchemy can open",
  ),
  'a negative heartbeat grace period': (
    _tune(**{'study.grace_period': -5}),
    'tune.study.grace_period=-5 must be a whole number',
  ),
  'a study database that is not one': (
    _tune(corrupt_database=True),
    'the study database sqlite:///{t}/tune/study.db cannot be read (file is not a '
    'database): restore it',
  ),
  'a training config given as a tuning config': (
    lambda d, t, w: lambda: run_worker(tiny_config(d), t / 'tune'),
    '--tune is not a tuning config: it has no kind, study, space, base (a training config?)',
  ),
  'a model too large for the memory': (
    lambda d, t, w: (
      lambda: train_and_evaluate(tiny_config(d, **{'model.hidden_size': 300_000}), t / 'new')
    ),
    'model.hidden_size=300000 gives 1 x ',
  ),
}


@pytest.mark.parametrize('case', CASES)
def test_hostile_input_is_one_clear_error_line(case, data_dir, trained, tmp_path, capsys):
  set_up, expected = CASES[case]
  workdir = shutil.copytree(trained, tmp_path / 'run', symlinks=True)
  job = set_up(data_dir, tmp_path, workdir)
  with pytest.raises(SystemExit) as stopped:
    cli.run(job)
  assert stopped.value.code == 1
  err = capsys.readouterr().err
  assert err.startswith('error: ') and 'Traceback' not in err and err.count('\n') == 1
  assert expected.format(t=tmp_path, w=workdir) in err
  victim = tmp_path / 'victim.txt'
  assert not victim.exists() or victim.read_text() == 'keep me'


def test_the_lock_is_never_opened_through_a_link(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  victim = _victim(tmp_path)
  os.symlink(victim, workdir / 'lock')
  with pytest.raises(Exception, match='is a symbolic link'):
    with workdir_lock(workdir):
      pass
  assert victim.read_text() == 'keep me'


# The Python API: id -> (a call of the loaded model, the ValueError's one line)
API_CASES = {
  **{
    f'score({label})': (lambda m, text=text: m.score(text), message)
    for label, text, message in (
      ('None', None, 'text must be a str, got NoneType'),
      ("b'bytes'", b'the company', 'text must be a str, got bytes: decode it first'),
      ("'\\n\\n\\n'", '\n\n\n', 'text has no word to score'),
      ("''", '', 'text has no word to score'),
    )
  },
  **{
    f'generate({label})': (lambda m, kwargs=kwargs: m.generate(**kwargs), message)
    for label, kwargs, message in (
      ('prompt=123', {'prompt': 123}, 'prompt must be text (a str), got int'),
      ('num_tokens=-3', {'num_tokens': -3}, 'num_tokens must be from 1 to 10,000, got -3'),
      ('num_tokens=2.5', {'num_tokens': 2.5}, 'num_tokens must be a whole number, got 2.5'),
      ('num_tokens=10**8', {'num_tokens': 10**8}, 'num_tokens must be from 1 to 10,000'),
      ('num_samples=0', {'num_samples': 0}, 'num_samples must be from 1 to 1,024, got 0'),
      ('beam_width=-2', {'beam_width': -2}, 'beam_width must be at least 0, got -2'),
      ('seed=-1', {'seed': -1}, 'seed must be from 0 to 4,294,967,295'),
    )
  },
}


@pytest.fixture(scope='module')
def loaded(trained):
  return lm_zoo.load(trained)


@pytest.mark.parametrize('case', API_CASES)
def test_a_bad_argument_to_the_api_is_one_line_naming_it(case, loaded):
  call, message = API_CASES[case]
  with pytest.raises(ValueError) as refused:
    call(loaded)
  assert message in str(refused.value) and '\n' not in str(refused.value)


def test_a_missing_tuning_config_file_is_one_line_naming_the_flag(tmp_path):
  refused = run_script(
    ['launch/tune.py', '--tune=/nonexistent/tune.py', f'--workdir={tmp_path / "tune"}'], {}
  )
  assert refused.returncode == 1
  assert refused.stderr.splitlines()[0] == (
    "error: --tune: [Errno 2] No such file or directory: '/nonexistent/tune.py'"
  )
