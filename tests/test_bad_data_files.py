"""Bad data folders and files, given on purpose: each is one clear `error:`
line naming the folder or file, exit status 1, and no traceback; a standard
file that differs from the published one is named in a warning."""

import logging

import pytest
from refusals import data_folder, refused_in_one_line, tiny_config

from lm_zoo.data import load_corpus
from lm_zoo.training import train_and_evaluate


def _data(train, **fields):
  return lambda d, t: (
    lambda: train_and_evaluate(tiny_config(data_folder(t, d, train), **fields), t / 'new')
  )


# id -> (set-up(data_dir, tmp_path) -> job, what the error line says; {t} is tmp_path)
CASES = {
  'missing data folder': (
    lambda d, t: lambda: train_and_evaluate(tiny_config(t / 'nope'), t / 'new'),
    'data folder {t}/nope does not exist',
  ),
  'missing corpus folder': (
    lambda d, t: lambda: train_and_evaluate(tiny_config(t), t / 'new'),
    'corpus folder {t}/ptb is missing',
  ),
  'missing data file': (_data(None), 'missing data file {t}/data/ptb/train.txt'),
  'empty data file': (_data(b''), 'data file {t}/data/ptb/train.txt is empty'),
  'binary data file': (_data(b'\x00\xff\xfe garbage'), 'is not UTF-8 text'),
  'truncated data file': (
    _data(b'the company said it \nwill', **{'data.train_tokens': 0}),
    'data.bptt=10 is longer than each of the data.batch_size=4 rows '
    'the training split is cut into (2 steps)',
  ),
}


@pytest.mark.parametrize('case', CASES)
def test_a_bad_data_file_is_one_clear_error_line(case, data_dir, tmp_path, capsys):
  set_up, expected = CASES[case]
  assert expected.format(t=tmp_path) in refused_in_one_line(set_up(data_dir, tmp_path), capsys)


def test_a_truncated_standard_data_file_is_named_in_a_warning(data_dir, tmp_path, caplog):
  folder = data_folder(tmp_path, data_dir, (data_dir / 'ptb' / 'train.txt').read_bytes()[:5000])
  with caplog.at_level(logging.WARNING, 'lm_zoo'):
    load_corpus('ptb', folder)
    load_corpus('ptb', folder)  # hashed once per process
  assert caplog.text.count('differs from the standard') == 1
  assert f'data file {folder}/ptb/train.txt differs from the standard ptb file' in caplog.text
