"""A run's work directory: its lock, its saved config, and which configs may resume it."""

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import hold_lock

import lm_zoo
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError, WorkdirInUse
from lm_zoo.runs import load_trained
from lm_zoo.runs.checkpoints import FORMAT_VERSION
from lm_zoo.runs.files import DATA_FILE
from lm_zoo.runs.finished import initial_params, load_config
from lm_zoo.runs.workdir import (
  SHAPE_FIELDS,
  check_resumable,
  record_command,
  save_config,
  workdir_lock,
)
from lm_zoo.training import train_and_evaluate


def test_a_second_process_is_refused_with_the_holders_pid_and_host(tiny_config, tmp_path):
  release = tmp_path / 'release'
  holder = hold_lock(tmp_path / 'run', release)
  with pytest.raises(WorkdirInUse, match=f'pid {holder.pid} on host {socket.gethostname()}'):
    train_and_evaluate(tiny_config, tmp_path / 'run')
  assert not (tmp_path / 'run' / 'checkpoints').exists()  # refused before writing anything
  release.touch()
  holder.wait(timeout=30)
  # The kernel dropped the lock with its process: the run can start.
  with workdir_lock(tmp_path / 'run'):
    assert (
      tmp_path / 'run' / 'lock'
    ).read_text() == f'pid {os.getpid()} on host {socket.gethostname()}\n'


def test_waiting_for_the_lock_returns_once_its_holder_is_gone(tmp_path):
  release = tmp_path / 'release'
  holder = hold_lock(tmp_path / 'run', release)
  subprocess.Popen(
    [
      sys.executable,
      '-c',
      f'import time, pathlib; time.sleep(1); pathlib.Path({str(release)!r}).touch()',
    ]
  )
  start = time.perf_counter()
  with workdir_lock(tmp_path / 'run', wait=True):
    assert time.perf_counter() - start > 0.5
    assert release.exists()  # the holder let go only after it was told to
  holder.wait(timeout=30)


def test_a_lock_file_removed_by_hand_still_keeps_a_second_run_out(tmp_path):
  release = tmp_path / 'release'
  holder = hold_lock(tmp_path / 'run', release)
  (tmp_path / 'run' / 'lock').unlink()
  with pytest.raises(
    WorkdirInUse,
    match='in use by another process \\(its lock file was removed\\): wait for that run to end',
  ):
    with workdir_lock(tmp_path / 'run'):
      pass
  release.touch()
  holder.wait(timeout=30)
  with workdir_lock(tmp_path / 'run'):  # free again once the holder is gone
    pass


def test_a_config_of_another_format_or_with_unknown_fields_is_refused(tmp_path):
  save_config(base_config(), tmp_path)
  path = tmp_path / 'config.json'
  saved = json.loads(path.read_text())
  assert (saved['format_version'], saved['lm_zoo_version']) == (FORMAT_VERSION, lm_zoo.__version__)
  older = {k: v for k, v in saved.items() if k not in ('format_version', 'lm_zoo_version')}
  path.write_text(json.dumps(older))
  with pytest.raises(ConfigError) as refused:
    load_config(tmp_path)
  assert str(refused.value) == (
    f'{tmp_path} was written by lm_zoo an earlier version (format None); this is lm_zoo '
    f'{lm_zoo.__version__} (format {FORMAT_VERSION}), which reads only its own: use that '
    'lm_zoo for it, or train again in a new --workdir'
  )
  path.write_text(json.dumps({**saved, 'format_version': FORMAT_VERSION - 1}))
  with pytest.raises(ConfigError, match=rf'\(format {FORMAT_VERSION - 1}\); this is lm_zoo'):
    load_config(tmp_path)  # the format before this one's parameter tree
  saved['model']['fused_recurrence'] = True
  saved['hyper'] = {'x': 1}
  path.write_text(json.dumps(saved))
  with pytest.raises(
    ConfigError,
    match=r'config.json has fields this lm_zoo does not know: '
    r'model.fused_recurrence, hyper: it was edited',
  ):
    load_config(tmp_path)
  path.write_text('[1, 2]')
  with pytest.raises(ConfigError, match=r'config.json holds no config \(a JSON list\)'):
    load_config(tmp_path)
  with pytest.raises(ConfigError, match='not found'):
    load_config(tmp_path / 'elsewhere')


def test_a_truncated_config_is_named(tmp_path):
  (tmp_path / 'config.json').write_text('{"data": {"bptt": 2')
  with pytest.raises(ConfigError, match='corrupt or truncated'):
    load_config(tmp_path)


def test_saved_config_round_trips(tmp_path):
  config = base_config()
  config.model.update(hidden_size=37, mogrifier={'rounds': 3, 'rank': 5})
  save_config(config, tmp_path)
  assert load_config(tmp_path).to_dict() == config.to_dict()


@pytest.mark.parametrize(
  'field, value',
  [
    ('model.hidden_size', 24),
    ('model.mogrifier.rounds', 2),
    ('data.batch_size', 7),
    ('model.recurrent_bias', True),
  ],
)
def test_only_a_shape_field_change_refuses_to_resume(tmp_path, field, value):
  config = base_config()
  save_config(config, tmp_path)
  unchanged_shapes = base_config()
  unchanged_shapes.optimizer.learning_rate = 0.123  # not a shape: resumes
  unchanged_shapes.data.bptt = 7
  check_resumable(unchanged_shapes, tmp_path)
  changed = base_config()
  section, *path, name = field.split('.')
  target = changed[section]
  for part in path:
    target = target[part]
  target[name] = value
  # The error names the top-level shape field (model.mogrifier for its rounds).
  named = next(f for f in SHAPE_FIELDS if field.startswith(f))
  with pytest.raises(ConfigError, match=f'different {named} '):
    check_resumable(changed, tmp_path)


def test_resuming_with_other_training_fields_warns_naming_them(tmp_path, caplog):
  # A recipe's default can change under a run (the Zaremba schedule did).
  config = base_config()
  save_config(config, tmp_path)
  check_resumable(config, tmp_path)
  assert 'changed training fields' not in caplog.text
  config.schedule.decay_after = 7
  config.train.num_epochs = 5  # a budget, not how the run trains: not named
  with caplog.at_level(logging.WARNING, logger='lm_zoo'):
    check_resumable(config, tmp_path)
  assert 'changed training fields: schedule.decay_after 4 -> 7. The rest' in caplog.text
  assert 'num_epochs' not in caplog.text
  caplog.clear()
  config.data.bptt = 70  # what each step sees
  with caplog.at_level(logging.WARNING, logger='lm_zoo'):
    check_resumable(config, tmp_path)
  assert 'data.bptt 35 -> 70' in caplog.text


def test_init_from_a_directory_without_a_run_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match='not a work directory'):
    initial_params(tmp_path, like=None)
  save_config(base_config(), tmp_path)
  with pytest.raises(ConfigError, match='no best checkpoint'):
    initial_params(tmp_path, like=None)


def _copy_of_ptb(data_dir, tmp_path, valid: bytes | None = None):
  folder = tmp_path / 'data' / 'ptb'
  folder.mkdir(parents=True)
  for split in ('train', 'valid', 'test'):
    text = (data_dir / 'ptb' / f'{split}.txt').read_bytes()
    (folder / f'{split}.txt').write_bytes(valid if split == 'valid' and valid else text)
  return folder.parent


def test_a_run_is_scored_and_resumed_only_on_the_data_it_trained_on(
  tiny_config, data_dir, tmp_path
):
  tiny_config.train.num_epochs = 1
  train_and_evaluate(tiny_config, tmp_path / 'run')
  saved = json.loads((tmp_path / 'run' / DATA_FILE).read_text())
  assert saved['vocab_size'] == 10_000
  assert saved['valid']['tokens'] == tiny_config.data.valid_tokens
  same = _copy_of_ptb(data_dir, tmp_path / 'same')
  load_trained(tmp_path / 'run', str(same))  # the same files elsewhere: fine
  # Two words of valid swapped: the vocabulary keeps its ids, the split does not.
  valid = (data_dir / 'ptb' / 'valid.txt').read_text().split('\n')
  first = valid[0].split()
  valid[0] = ' '.join([first[1], first[0], *first[2:]])
  other = _copy_of_ptb(data_dir, tmp_path / 'other', '\n'.join(valid).encode())
  with pytest.raises(
    ConfigError,
    match=r'the ptb data differs from what .* was trained on: '
    r'the valid split',
  ):
    load_trained(tmp_path / 'run', str(other))
  tiny_config.data.data_dir = str(other)
  tiny_config.train.num_epochs = 2
  with pytest.raises(ConfigError, match='the valid split'):
    train_and_evaluate(tiny_config, tmp_path / 'run')  # nor resumed on it


def test_each_command_line_is_added_to_commands_txt_and_never_through_a_link(tmp_path):
  record_command(tmp_path, 'lm-zoo-train --workdir=runs/a')
  record_command(tmp_path, "lm-zoo-train --config.model.hidden_size=8 'two\nlines'")
  first, second = (tmp_path / 'commands.txt').read_text().splitlines()
  assert first.endswith(
    f'lm_zoo {lm_zoo.__version__} in {os.getcwd()}: lm-zoo-train --workdir=runs/a'
  )
  assert second.endswith(": lm-zoo-train --config.model.hidden_size=8 'two lines'")
  linked = tmp_path / 'linked'
  linked.mkdir()
  outside = tmp_path / 'outside.txt'
  os.symlink(outside, linked / 'commands.txt')
  with pytest.raises(
    ConfigError, match='commands.txt is a symbolic link: lm_zoo writes nothing through links'
  ):
    record_command(linked, 'lm-zoo-train')
  assert not outside.exists()
