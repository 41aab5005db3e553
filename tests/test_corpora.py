"""Corpora against the published statistics, and each bad input's clear error."""

import numpy as np
import pytest
from conftest import REPO

from lm_zoo.data import corpora, load_corpus, split_enwik8
from lm_zoo.errors import DataError

# ../shared/data/README.md (the AWD-LSTM / pytorch word_language_model counts).
PUBLISHED = {
  'ptb': ((929_589, 73_760, 82_430), 10_000),
  'wikitext2': ((2_088_628, 217_646, 245_569), 33_278),
  'ptb_char': ((5_017_483, 393_043, 442_424), 50),
}


@pytest.mark.parametrize('name', sorted(PUBLISHED))
def test_counts_equal_published_statistics(name, data_dir):
  corpus = load_corpus(name, data_dir)
  (n_train, n_valid, n_test), vocab_size = PUBLISHED[name]
  assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (n_train, n_valid, n_test)
  assert len(corpus.vocab) == vocab_size
  for split in (corpus.train, corpus.valid, corpus.test):
    assert split.dtype == np.int32 and split.ndim == 1
    assert 0 <= split.min() and split.max() < vocab_size


def test_ptb_decodes_back_to_the_file(data_dir):
  corpus = load_corpus('ptb', data_dir)
  lines = (data_dir / 'ptb' / 'valid.txt').read_text().split('\n')[:3]
  decoded = corpus.vocab.decode(corpus.valid[: len(' '.join(lines).split()) + 3])
  assert decoded.split('\n')[:3] == [' '.join(line.split()) for line in lines]
  assert corpus.unit == 'word'


def test_ptb_char_units_and_round_trip(data_dir):
  corpus = load_corpus('ptb_char', data_dir)
  assert corpus.unit == 'char'
  text = corpus.vocab.decode(corpus.valid[:200])
  np.testing.assert_array_equal(
    corpus.vocab.encode_text(text.split('\n')[0]), corpus.valid[: len(text.split('\n')[0])]
  )


def test_the_library_reads_no_environment_variable(tmp_path, monkeypatch):
  """$LM_ZOO_DATA is the programs' (lm_zoo.cli): in Python the folder is
  an argument, else shared/data beside the checkout."""
  monkeypatch.setenv('LM_ZOO_DATA', str(tmp_path / 'elsewhere'))
  monkeypatch.setattr(corpora, 'DEFAULT_DATA_DIR', tmp_path / 'nowhere')
  with pytest.raises(DataError, match=f'{tmp_path}/nowhere does not exist'):
    load_corpus('ptb')


def _text_corpus(tmp_path, files):
  folder = tmp_path / 'ptb'
  folder.mkdir(parents=True)
  for name, content in files.items():
    (folder / name).write_bytes(content)
  return tmp_path


GOOD = b'the cat sat\non the mat\n'


@pytest.mark.parametrize(
  'files, message',
  [
    ({'train.txt': GOOD, 'valid.txt': GOOD}, 'missing data file'),
    ({'train.txt': GOOD, 'valid.txt': b'  \n', 'test.txt': GOOD}, 'is empty'),
    ({'train.txt': GOOD, 'valid.txt': b'caf\xe9 au lait\n', 'test.txt': GOOD}, 'not UTF-8 text'),
  ],
)
def test_bad_files_give_clear_errors(tmp_path, files, message):
  root = _text_corpus(tmp_path, files)
  with pytest.raises(DataError, match=message):
    load_corpus('ptb', root)


def test_unknown_name_missing_folder_and_no_data_dir(tmp_path, monkeypatch):
  with pytest.raises(DataError, match="unknown corpus 'ptbx'.*ptb, wikitext2"):
    load_corpus('ptbx', tmp_path)
  with pytest.raises(DataError, match='corpus folder .*wikitext-2 is missing'):
    load_corpus('wikitext2', tmp_path)
  with pytest.raises(DataError, match='does not exist'):
    load_corpus('ptb', tmp_path / 'nowhere')
  monkeypatch.setattr(corpora, 'DEFAULT_DATA_DIR', tmp_path / 'nowhere')
  with pytest.raises(DataError) as missing:
    load_corpus('ptb')
  assert str(missing.value) == (
    f'data folder {tmp_path}/nowhere does not exist: name the folder holding ptb/, '
    'wikitext-2/, ptb-char/ (LM_ZOO_DATA for every program, or lm-zoo-train '
    "--config.data.data_dir, the other programs' --data_dir; in Python, the data_dir "
    'argument), or fetch them with lm-zoo-download'
  )


def test_data_dir_defaults_to_shared_data_beside_the_checkout_from_any_folder(
  tmp_path, monkeypatch
):
  assert corpora.DEFAULT_DATA_DIR == REPO.parent / 'shared' / 'data'
  monkeypatch.setattr(corpora, 'DEFAULT_DATA_DIR', tmp_path / 'shared' / 'data')
  _text_corpus(
    tmp_path / 'shared' / 'data', {n: GOOD for n in ('train.txt', 'valid.txt', 'test.txt')}
  )
  monkeypatch.chdir('/')  # the current folder plays no part
  assert len(load_corpus('ptb').train) == 8  # 6 words and 2 <eos>


def test_small_text_corpus_counts(tmp_path):
  root = _text_corpus(
    tmp_path, {'train.txt': GOOD, 'valid.txt': b'the cat\n', 'test.txt': b'a dog\n'}
  )
  corpus = load_corpus('ptb', root)
  # each line's tokens plus <eos>; vocabulary in order of first appearance
  assert corpus.vocab.tokens == ('the', 'cat', 'sat', '<eos>', 'on', 'mat', 'a', 'dog')
  np.testing.assert_array_equal(corpus.train, [0, 1, 2, 3, 4, 0, 5, 3])
  np.testing.assert_array_equal(corpus.test, [6, 7, 3])


def _reference_load(folder):
  """The counting convention restated: the file iterated line by line,
  `line.split() + ['<eos>']`, ids in order of first appearance."""
  index, streams = {}, {}
  for split in ('train', 'valid', 'test'):
    with open(folder / f'{split}.txt', encoding='utf-8', newline=None) as f:
      tokens = [t for line in f for t in line.split() + ['<eos>']]
    streams[split] = [index.setdefault(t, len(index)) for t in tokens]
  return tuple(index), streams


def test_ptb_equals_the_convention_restated_line_by_line(data_dir):
  tokens, streams = _reference_load(data_dir / 'ptb')
  corpus = load_corpus('ptb', data_dir)
  assert corpus.vocab.tokens == tokens
  for split, ids in streams.items():
    np.testing.assert_array_equal(corpus.split(split), ids)


def test_a_corpus_is_read_once_and_again_when_a_file_changes(tmp_path):
  root = _text_corpus(
    tmp_path, {'train.txt': GOOD, 'valid.txt': b'the cat\n', 'test.txt': b'a dog\n'}
  )
  first = load_corpus('ptb', root)
  assert load_corpus('ptb', root) is first
  with pytest.raises(ValueError, match='read-only'):
    first.train[0] = 1  # shared by every caller, so nobody may change it
  (root / 'ptb' / 'test.txt').write_bytes(b'a bird\n')
  changed = load_corpus('ptb', root)
  assert changed is not first and changed.vocab.decode(changed.test[:2]) == 'a bird'
  (root / 'ptb' / 'test.txt').unlink()
  with pytest.raises(DataError, match='missing data file'):
    load_corpus('ptb', root)


def test_enwik8_split_is_90m_5m_5m(tmp_path):
  n = corpora.ENWIK8_BYTES
  raw = bytearray(
    np.random.default_rng(0).integers(ord('a'), ord('z') + 1, n, dtype=np.uint8).tobytes()
  )
  # markers at the split boundaries
  raw[0], raw[89_999_999], raw[90_000_000] = ord('A'), ord('B'), ord('C')
  raw[94_999_999], raw[95_000_000], raw[-1] = ord('D'), ord('E'), ord('F')
  (tmp_path / 'enwik8').mkdir()
  (tmp_path / 'enwik8' / 'enwik8').write_bytes(bytes(raw))
  corpus = load_corpus('enwik8', tmp_path)
  assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (
    90_000_000,
    5_000_000,
    5_000_000,
  )
  decode = lambda ids: corpus.vocab.decode(ids)
  assert decode(corpus.train[[0, -1]]) == 'AB'
  assert decode(corpus.valid[[0, -1]]) == 'CD'
  assert decode(corpus.test[[0, -1]]) == 'EF'
  assert len(corpus.vocab) == 26 + 6 and corpus.unit == 'char'
  with pytest.raises(DataError, match='exactly 100,000,000 bytes'):
    split_enwik8(b'short')
