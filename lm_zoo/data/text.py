"""Corpora of one's own text: a folder of plain text files
(`data.name=text`), or the text feature of a TFDS dataset (`data.name=tfds`).

Each line is a sentence: its tokens, then <eos>, as the standard corpora
are read. At word level the tokens are the line's words (split on
whitespace); at character level they are its characters, a space written
'_' as in PTB-char (so that '_' itself reads back as a space).

The vocabulary lists the tokens in order of first appearance over train,
valid and test. Capped (`max_size` > 0 or `min_count` > 1), it keeps the
training split's tokens seen at least `min_count` times, the `max_size` - 1
most frequent of them (ties: first seen first), in order of first
appearance, then `<unk>`; every other token of every split reads as `<unk>`,
as PTB's own preprocessing did with its 10,000 words.
"""

from __future__ import annotations

import os
import pathlib
from typing import Iterable, Mapping

import numpy as np

from lm_zoo.data.corpora import SPLITS, Corpus
from lm_zoo.data.vocab import EOS, UNK, Vocab
from lm_zoo.errors import DataError

LEVELS = ('word', 'char')


def text_corpus(
  name: str,
  lines: Mapping[str, Iterable[str]],
  level: str = 'word',
  max_size: int = 0,
  min_count: int = 1,
) -> Corpus:
  """A corpus from the lines of each split (`lines['train']`, ...), its
  vocabulary capped at `max_size` tokens (0: no cap) of at least
  `min_count` training occurrences (see above)."""
  if level not in LEVELS:
    raise DataError(f'unknown text level {level!r} (data.level): choose one of {", ".join(LEVELS)}')
  _check_caps(max_size, min_count)
  tokenize = Vocab((), kind=level).tokenize
  tokens = {
    split: [token for line in lines[split] for token in [*tokenize(line.rstrip('\n')), EOS]]
    for split in SPLITS
  }
  empty = [split for split in SPLITS if len(tokens[split]) < 2]
  if empty:
    raise DataError(f'the {empty[0]} split of {name} has no text')
  index: dict[str, int] = {}
  if max_size > 0 or min_count > 1:
    for token in _kept(tokens['train'], max_size, min_count):
      index.setdefault(token, len(index))
    index.setdefault(UNK, len(index))
    unk = index[UNK]
    streams = {
      split: np.fromiter((index.get(t, unk) for t in tokens[split]), np.int32) for split in SPLITS
    }
  else:
    for split in SPLITS:
      for token in tokens[split]:
        index.setdefault(token, len(index))
    streams = {split: np.fromiter((index[t] for t in tokens[split]), np.int32) for split in SPLITS}
  return Corpus(name=name, vocab=Vocab(tuple(index), kind=level), unit=level, **streams)


def _check_caps(max_size: int, min_count: int) -> None:
  for field, value, low in (('data.max_vocab', max_size, 0), ('data.min_count', min_count, 1)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise DataError(f'{field} must be a whole number >= {low}, got {value!r}')
  if max_size == 1:
    raise DataError('data.max_vocab must be 0 (no cap) or at least 2: <unk> takes one place')


def _kept(train: list[str], max_size: int, min_count: int) -> list[str]:
  """The training tokens a capped vocabulary keeps, in order of first
  appearance (<unk> itself is added after them)."""
  counts: dict[str, int] = {}
  for token in train:
    counts[token] = counts.get(token, 0) + 1
  order = {token: rank for rank, token in enumerate(counts)}
  kept = [t for t, n in counts.items() if n >= min_count and t != UNK]
  if max_size > 0:
    kept = sorted(kept, key=lambda t: (-counts[t], order[t]))[: max_size - 1]
  return sorted(kept, key=order.get)


def load_text_folder(
  folder: str | os.PathLike, level: str = 'word', max_size: int = 0, min_count: int = 1
) -> Corpus:
  """The corpus of FOLDER/train.txt, valid.txt and test.txt (UTF-8), its
  vocabulary capped as `text_corpus` says."""
  folder = pathlib.Path(folder)
  lines = {}
  for split in SPLITS:
    path = folder / f'{split}.txt'
    if not path.is_file():
      raise DataError(
        f'missing data file {path}: a text corpus (data.name=text) is a folder '
        'holding train.txt, valid.txt and test.txt (data.data_dir)'
      )
    try:
      lines[split] = path.read_text('utf-8').splitlines()
    except UnicodeDecodeError as err:
      raise DataError(
        f'data file {path} is not UTF-8 text (undecodable byte at offset {err.start})'
      ) from None
  return text_corpus(str(folder), lines, level, max_size, min_count)


def load_tfds_text(
  dataset: str,
  data_dir: str | os.PathLike | None = None,
  feature: str = 'text',
  splits: Iterable[str] = ('train', 'valid', 'test'),
  level: str = 'word',
  max_size: int = 0,
  min_count: int = 1,
) -> Corpus:
  """The corpus of a TFDS dataset's `feature` (strings, one sentence each),
  its vocabulary capped as `text_corpus` says, its splits named by `splits`
  (in our order train, valid, test), read as random-access data sources
  (ArrayRecord; tensorflow-datasets, not TensorFlow). For example the
  `lm_zoo_corpus/ptb` that `lm-zoo-download --tfds_dir` writes, or `lm1b`
  prepared as ArrayRecord."""
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise DataError("a TFDS corpus needs tensorflow-datasets: pip install 'lm_zoo[tfds]'") from None
  names = tuple(splits)
  if len(names) != len(SPLITS):
    raise DataError(
      f"data.tfds_splits must name the dataset's train, valid and test splits, got {names}"
    )
  try:
    source = tfds.data_source(dataset, data_dir=data_dir)
    lines = {
      ours: [_text(example[feature]) for example in source[theirs]]
      for ours, theirs in zip(SPLITS, names)
    }
  except (KeyError, ValueError, FileNotFoundError, OSError) as err:
    raise DataError(
      f'cannot read the {feature!r} text of the TFDS dataset {dataset} '
      f'(splits {", ".join(names)}) from {data_dir or "the default folder"}: '
      f'{err}'
    ) from None
  return text_corpus(dataset, lines, level, max_size, min_count)


def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)
