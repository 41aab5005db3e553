"""Loading the real corpora (PTB word and char, WikiText-2, enwik8) as id streams.

Token counting follows the AWD-LSTM / pytorch `word_language_model` convention:
each line read as Python iterates a text file gives `line.split() + ['<eos>']`,
and the vocabulary lists tokens in order of first appearance over train, valid
and test. With it the counts equal the published statistics (PTB 929,589 /
73,760 / 82,430 tokens, vocabulary 10,000; WikiText-2 2,088,628 / 217,646 /
245,569, vocabulary 33,278; PTB-char vocabulary 50).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import pathlib
from typing import Any

import numpy as np

from lm_zoo.data.download import FILES, verify
from lm_zoo.data.vocab import EOS, Vocab
from lm_zoo.errors import DataError

log = logging.getLogger(__name__)

# The data folder beside a checkout of this repository (../shared/data from
# its root), wherever the program runs from. The programs read $LM_ZOO_DATA
# (`lm_zoo.cli.DATA_DIR_ENV`); the library takes the folder as an argument.
DEFAULT_DATA_DIR = pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data'
SPLITS = ('train', 'valid', 'test')
# Standard enwik8 split (Mahoney's Hutter-prize data): first 90M / next 5M / last 5M bytes.
ENWIK8_BYTES = 100_000_000
ENWIK8_VALID_BYTES = 5_000_000
ENWIK8_TEST_BYTES = 5_000_000


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A corpus as three int32 id streams sharing one vocabulary.

  Attributes:
    name: the name it was loaded by.
    vocab: the shared vocabulary.
    train, valid, test: 1-D int32 arrays of token ids.
    unit: 'word' (report perplexity) or 'char' (report bits per character).
  """

  name: str
  vocab: Vocab
  train: np.ndarray
  valid: np.ndarray
  test: np.ndarray
  unit: str

  def split(self, name: str) -> np.ndarray:
    if name not in SPLITS:
      raise DataError(f'unknown split {name!r}: choose one of {", ".join(SPLITS)}')
    return getattr(self, name)

  def fingerprint(self) -> dict[str, Any]:
    """What a model trained on this corpus depends on: the vocabulary (its
    size and a sha256 of its tokens in id order) and each split's token
    count and sha256 of its ids. Two loads of the same files agree; a
    changed file changes the ids or the vocabulary's order, and so this."""
    return {
      'name': self.name,
      'vocab_size': len(self.vocab),
      'vocab_sha256': vocab_sha256(self.vocab),
      **{
        split: {
          'tokens': int(len(self.split(split))),
          'sha256': hashlib.sha256(
            np.ascontiguousarray(self.split(split), np.int32).tobytes()
          ).hexdigest(),
        }
        for split in SPLITS
      },
    }


def vocab_sha256(vocab: Vocab) -> str:
  """sha256 of a vocabulary's tokens in id order (`Corpus.fingerprint`)."""
  return hashlib.sha256('\n'.join(vocab.tokens).encode('utf-8', 'surrogatepass')).hexdigest()


def _read_tokens(path: pathlib.Path) -> list[str]:
  """Reads one tokenised text file as its tokens, each line ending in <eos>."""
  if not path.is_file():
    raise DataError(
      f'missing data file {path}: the corpus folder must hold train.txt, '
      'valid.txt and test.txt (lm-zoo-download fetches ptb, wikitext2 and ptb_char)'
    )
  raw = path.read_bytes()
  if not raw.strip():
    raise DataError(
      f'data file {path} is empty: restore it (lm-zoo-download fetches a standard '
      "corpus's files again)"
    )
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as err:
    raise DataError(
      f'data file {path} is not UTF-8 text (undecodable byte at offset '
      f'{err.start}): is it the right file, or was it corrupted?'
    ) from None
  # splitlines(keepends) would also split on \x1c, \u2028 ...; file iteration
  # splits on newlines only, which is what the published counts assume.
  lines = text.replace('\r\n', '\n').replace('\r', '\n').split('\n')
  if lines[-1] == '':
    lines.pop()
  tokens: list[str] = []
  for line in lines:
    tokens.extend(line.split())
    tokens.append(EOS)
  return tokens


def _load_text_corpus(name: str, folder: pathlib.Path, kind: str) -> Corpus:
  splits = {s: _read_tokens(folder / f'{s}.txt') for s in SPLITS}
  # dict keeps insertion order: the tokens in order of first appearance.
  first_seen = dict.fromkeys(itertools.chain.from_iterable(splits.values()))
  index = {token: i for i, token in enumerate(first_seen)}
  streams = {
    s: _read_only(np.fromiter(map(index.__getitem__, tokens), np.int32, len(tokens)))
    for s, tokens in splits.items()
  }
  vocab = Vocab(tuple(index), kind=kind)
  return Corpus(name=name, vocab=vocab, unit=vocab.unit, **streams)


def _read_only(array: np.ndarray) -> np.ndarray:
  # Loaded corpora are shared by every caller in the process (`load_corpus`).
  array.setflags(write=False)
  return array


def _file_states(folder: pathlib.Path) -> tuple | None:
  """What tells a text corpus' files apart from their earlier versions (None
  where one is missing, so that loading names it)."""
  try:
    return tuple(
      (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
      for st in (os.stat(folder / f'{s}.txt') for s in SPLITS)
    )
  except OSError:
    return None


# (name, folder) -> (file states, corpus): the text corpora loaded in this
# process, loaded again when a file changes. A few entries: a process seldom
# reads more corpora than that, and each is a few MB of ids.
_LOADED: collections.OrderedDict[tuple[str, pathlib.Path], tuple[tuple, Corpus]] = (
  collections.OrderedDict()
)
_LOADED_MAX = 4


def _cached_text_corpus(name: str, folder: pathlib.Path, kind: str) -> Corpus:
  key, states = (name, folder.resolve()), _file_states(folder)
  if states is not None and key in _LOADED and _LOADED[key][0] == states:
    _LOADED.move_to_end(key)
    return _LOADED[key][1]
  corpus = _load_text_corpus(name, folder, kind)
  if states is not None:
    _LOADED[key] = (states, corpus)
    while len(_LOADED) > _LOADED_MAX:
      _LOADED.popitem(last=False)
  return corpus


def split_enwik8(raw: bytes, name: str = 'enwik8') -> Corpus:
  """Splits the 100M bytes of enwik8 into 90M / 5M / 5M byte-level streams."""
  if len(raw) != ENWIK8_BYTES:
    raise DataError(
      f'enwik8 must be exactly {ENWIK8_BYTES:,} bytes, got '
      f'{len(raw):,}: download it again (mattmahoney.net/dc/enwik8.zip)'
    )
  data = np.frombuffer(raw, dtype=np.uint8)
  symbols = np.flatnonzero(np.bincount(data, minlength=256))
  to_id = np.zeros(256, dtype=np.int32)
  to_id[symbols] = np.arange(len(symbols), dtype=np.int32)
  ids = to_id[data]
  n_train = ENWIK8_BYTES - ENWIK8_VALID_BYTES - ENWIK8_TEST_BYTES
  vocab = Vocab(tuple(chr(b) for b in symbols), kind='byte')
  return Corpus(
    name=name,
    vocab=vocab,
    train=ids[:n_train],
    valid=ids[n_train : n_train + ENWIK8_VALID_BYTES],
    test=ids[n_train + ENWIK8_VALID_BYTES :],
    unit='char',
  )


def _load_enwik8(name: str, folder: pathlib.Path) -> Corpus:
  path = folder / 'enwik8'
  if not path.is_file():
    raise DataError(
      f'missing data file {path}: unzip enwik8.zip (mattmahoney.net/dc/enwik8.zip) into that folder'
    )
  return split_enwik8(path.read_bytes(), name)


# How a user names the data folder, for errors about it.
WHERE_DATA_IS_NAMED = (
  'LM_ZOO_DATA for every program, or lm-zoo-train --config.data.data_dir, '
  "the other programs' --data_dir; in Python, the data_dir argument"
)
# name -> (folder under the data directory, vocabulary kind)
CORPORA = {
  'ptb': ('ptb', 'word'),
  'wikitext2': ('wikitext-2', 'word'),
  'ptb_char': ('ptb-char', 'char'),
  'enwik8': ('enwik8', 'byte'),
}


def chosen_data_dir(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The data folder asked for, existing or not: `data_dir`, else
  `DEFAULT_DATA_DIR` (shared/data beside the checkout lm_zoo runs from,
  whatever the current folder)."""
  return pathlib.Path(data_dir or DEFAULT_DATA_DIR).expanduser()


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The data folder (`chosen_data_dir`), which must exist."""
  path = chosen_data_dir(data_dir)
  if not path.is_dir():
    what = 'is a file, not a folder' if path.exists() else 'does not exist'
    raise DataError(
      f'data folder {path} {what}: name the folder holding ptb/, '
      f'wikitext-2/, ptb-char/ ({WHERE_DATA_IS_NAMED}), or fetch them with '
      'lm-zoo-download'
    )
  return path


@functools.cache  # hashing once per process and folder
def _warn_if_not_standard(name: str, data_dir: pathlib.Path) -> None:
  """Logs a WARNING for each file of corpus `name` whose sha256 is not the
  standard one (lm_zoo/data/download.py): scores on it do not compare with
  published ones. Missing files are left to the loader's error."""
  if name not in FILES:
    return
  for path in verify(name, data_dir):
    if (data_dir / path).is_file():
      log.warning(
        'data file %s differs from the standard %s file (its sha256 is not '
        'the one in lm_zoo/data/download.py): results on it will not compare '
        'with published ones; lm-zoo-download restores it',
        data_dir / path,
        name,
      )


def load_corpus(name: str, data_dir: str | os.PathLike | None = None) -> Corpus:
  """Loads a corpus by name ('ptb', 'wikitext2', 'ptb_char', 'enwik8').

  Args:
    name: the corpus name.
    data_dir: the folder holding the corpora's folders; defaults to
      shared/data beside the checkout (`resolve_data_dir`).

  Returns:
    A `Corpus` whose splits are 1-D int32 arrays.

  A file that differs from the standard one (`lm_zoo.data.download.verify`)
  is loaded with a WARNING naming it. A text corpus is read once per process
  while its files stay unchanged: later calls return the same `Corpus`, whose
  arrays are read-only (copy one to change it).

  Raises:
    DataError: unknown name, missing folder or file, empty or undecodable file.
  """
  if name not in CORPORA:
    raise DataError(f'unknown corpus {name!r}: choose one of {", ".join(CORPORA)}')
  subdir, kind = CORPORA[name]
  folder = resolve_data_dir(data_dir) / subdir
  if not folder.is_dir():
    fetch = (
      f'fetch it with lm-zoo-download --data_dir={folder.parent} --datasets={name}'
      if name in FILES
      else 'put its files there'
    )
    raise DataError(
      f'corpus folder {folder} is missing: corpus {name!r} expects it under '
      f'the data folder; {fetch}, or name the data folder that holds it '
      f'({WHERE_DATA_IS_NAMED})'
    )
  _warn_if_not_standard(name, folder.parent.resolve())
  if kind == 'byte':
    return _load_enwik8(name, folder)
  return _cached_text_corpus(name, folder, kind)
