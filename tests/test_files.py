"""lm_zoo.runs.files: how a work directory's files are written and read."""

import pytest

from lm_zoo.errors import ConfigError
from lm_zoo.runs import files


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
  path = tmp_path / 'summary.json'
  files.write_text_atomically(path, 'old')

  def full_disk(*args):
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(files.os, 'fsync', full_disk)
  with pytest.raises(OSError, match='No space left'):
    files.write_text_atomically(path, 'new')
  assert path.read_text() == 'old' and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_read_json_names_a_missing_or_damaged_file(tmp_path):
  with pytest.raises(ConfigError, match=f'{tmp_path}/gone.json is missing: the run keeps it'):
    files.read_json(tmp_path / 'gone.json', 'the run keeps it')
  (tmp_path / 'cut.json').write_text('{"a": ')
  with pytest.raises(ConfigError, match=f'{tmp_path}/cut.json is damaged'):
    files.read_json(tmp_path / 'cut.json', 'the run keeps it')
  (tmp_path / 'ok.json').write_text('{"a": 1}')
  assert files.read_json(tmp_path / 'ok.json', 'the run keeps it') == {'a': 1}
