"""What the bad- and hostile-input tests share (test_bad_inputs.py,
test_bad_configs.py, test_bad_data_files.py, test_hostile_inputs.py,
hostile_programs.py): a tiny training config, a data folder with its
training file swapped, and the check that a job is refused in one line."""

import os

import pytest

from lm_zoo import cli
from lm_zoo.configs import base_config

TINY = {
  'data.batch_size': 4,
  'data.bptt': 10,
  'data.eval_batch_size': 3,
  'data.test_batch_size': 2,
  'data.train_tokens': 401,
  'data.valid_tokens': 121,
  'data.test_tokens': 81,
  'model.embed_size': 16,
  'model.hidden_size': 16,
  'train.max_steps': 10,
  'train.log_every': 5,
  'generate.num_lines': 0,
}


def tiny_config(data_dir, **fields):
  """A 10-step run of a 16-unit LSTM on the data in `data_dir`, with `fields` set."""
  config = base_config()
  config.update_from_flattened_dict({**TINY, 'data.data_dir': str(data_dir), **fields})
  return config


def data_folder(tmp_path, data_dir, train: bytes | None):
  """A data folder whose ptb/train.txt is `train` (None: left out), the real
  valid and test files beside it."""
  folder = tmp_path / 'data' / 'ptb'
  folder.mkdir(parents=True)
  for split in ('valid', 'test'):
    os.symlink(data_dir / 'ptb' / f'{split}.txt', folder / f'{split}.txt')
  if train is not None:
    (folder / 'train.txt').write_bytes(train)
  return folder.parent


def refused_in_one_line(job, capsys) -> str:
  """Runs `job` as every program does (`cli.run`) and checks that it stops
  with exit status 1 and one `error:` line, no traceback; returns stderr."""
  with pytest.raises(SystemExit) as stopped:
    cli.run(job)
  assert stopped.value.code == 1
  err = capsys.readouterr().err
  assert err.startswith('error: ') and 'Traceback' not in err
  return err
