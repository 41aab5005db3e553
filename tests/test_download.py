"""The checksummed download, from file:// mirrors of the real data folder (no internet)."""

import hashlib
import pathlib
import shutil

import pytest
from conftest import run_script

from lm_zoo.data.download import FILES, download, verify
from lm_zoo.errors import DataError

UNREACHABLE = 'http://127.0.0.1:9'  # the discard port: the connection is refused


def _sums(data_dir: pathlib.Path) -> dict[str, str]:
  """SHA256SUMS of the data folder: {path: sha256}."""
  lines = (data_dir / 'SHA256SUMS').read_text().splitlines()
  return {path: sha for sha, path in (line.split() for line in lines)}


def test_table_matches_sha256sums(data_dir):
  table = {f.path: f for files in FILES.values() for f in files}
  assert {path: f.sha256 for path, f in table.items()} == _sums(data_dir)
  for path, f in table.items():
    assert (data_dir / path).stat().st_size == f.size, path
    assert f.url or f.source in table, path  # fetched, or rebuilt from a listed file


def test_download_gives_the_checksummed_bytes(data_dir, tmp_path):
  done = download(FILES, tmp_path, mirror=data_dir.as_uri())
  sums = _sums(data_dir)
  assert set(done) == set(sums)
  for path, sha in sums.items():
    assert hashlib.sha256((tmp_path / path).read_bytes()).hexdigest() == sha, path
  # ptb-char is rebuilt from the word-level files, byte for byte.
  assert {p for p, status in done.items() if status == 'rebuilt'} == {
    'ptb-char/train.txt',
    'ptb-char/valid.txt',
    'ptb-char/test.txt',
  }
  assert not list(tmp_path.rglob('*.part'))
  # A second run finds everything in place and fetches nothing.
  assert set(download(FILES, tmp_path, mirror=UNREACHABLE).values()) == {'present'}


def test_corrupted_source_is_not_written(data_dir, tmp_path):
  mirror = tmp_path / 'mirror'
  shutil.copytree(data_dir / 'ptb', mirror / 'ptb')
  valid = mirror / 'ptb' / 'valid.txt'
  valid.chmod(0o644)
  valid.write_bytes(valid.read_bytes().replace(b'the', b'teh', 1))
  with pytest.raises(DataError, match='checksum mismatch for ptb/valid.txt') as err:
    download(['ptb'], tmp_path / 'data', mirror=mirror.as_uri())
  expected = FILES['ptb'][1].sha256
  actual = hashlib.sha256(valid.read_bytes()).hexdigest()
  assert f'expected sha256 {expected}, got {actual}' in str(err.value)
  # train.txt came before it; of valid.txt nothing, not even a temporary file.
  assert sorted(p.name for p in (tmp_path / 'data' / 'ptb').iterdir()) == ['train.txt']


def test_wrong_file_in_place_is_replaced(data_dir, tmp_path):
  (tmp_path / 'ptb').mkdir()
  (tmp_path / 'ptb' / 'test.txt').write_text('not the test set\n')
  assert verify('ptb', tmp_path) == ['ptb/train.txt', 'ptb/valid.txt', 'ptb/test.txt']
  assert download(['ptb'], tmp_path, mirror=data_dir.as_uri())['ptb/test.txt'] == 'downloaded'
  assert verify('ptb', tmp_path) == []


def test_offline_names_the_files_to_copy(tmp_path):
  with pytest.raises(DataError, match='seems to be offline') as err:
    download(['wikitext2'], tmp_path, mirror=UNREACHABLE)
  message = str(err.value)
  assert 'train.txt, valid.txt, test.txt' in message
  assert str(tmp_path / 'wikitext-2') in message
  assert not (tmp_path / 'wikitext-2' / 'train.txt').exists()


def test_unknown_dataset(tmp_path):
  with pytest.raises(DataError, match="unknown dataset 'enwik8'"):
    download(['ptb', 'enwik8'], tmp_path)
  assert not (tmp_path / 'ptb').exists()  # checked before anything is fetched


def test_command(data_dir, tmp_path):
  target = tmp_path / 'data'
  ok = run_script(
    [
      'launch/download.py',
      '--datasets=ptb,mnist',
      f'--data_dir={target}',
      f'--mirror={data_dir.as_uri()}',
    ]
  )
  assert ok.returncode == 0, ok.stderr
  assert 'ptb/train.txt: downloaded' in ok.stdout
  assert 'mnist/t10k-labels-idx1-ubyte.gz: downloaded' in ok.stdout

  check = run_script(
    ['launch/download.py', '--datasets=ptb,ptb_char', '--verify_only'], {'LM_ZOO_DATA': str(target)}
  )
  assert check.returncode == 1
  assert check.stdout.splitlines() == [
    'ptb: ok',
    'ptb_char: missing or wrong: ptb-char/train.txt, ptb-char/valid.txt, ptb-char/test.txt',
  ]

  offline = run_script(
    [
      'launch/download.py',
      '--datasets=wikitext2',
      f'--data_dir={target}',
      f'--mirror={UNREACHABLE}',
    ]
  )
  assert offline.returncode == 1
  assert 'Traceback' not in offline.stderr
  last = offline.stderr.strip().splitlines()[-1]
  assert last.startswith('error: could not fetch') and 'seems to be offline' in last
