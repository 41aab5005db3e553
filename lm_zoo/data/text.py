"""Corpora of one's own text: a folder of plain text files
(`data.name=text`), or the text feature of a TFDS dataset (`data.name=tfds`).

Each line is a sentence: its tokens, then <eos>, as the standard corpora
are read. At word level the tokens are the line's words (split on
whitespace); at character level they are its characters, a space written
'_' as in PTB-char (so that '_' itself reads back as a space). The
vocabulary lists the tokens in order of first appearance over train, valid
and test.
"""

from __future__ import annotations

import os
import pathlib
from typing import Iterable, Mapping

import numpy as np

from lm_zoo.data.corpora import SPLITS, Corpus
from lm_zoo.data.vocab import EOS, Vocab
from lm_zoo.errors import DataError

LEVELS = ('word', 'char')


def text_corpus(name: str, lines: Mapping[str, Iterable[str]], level: str = 'word') -> Corpus:
  """A corpus from the lines of each split (`lines['train']`, ...)."""
  if level not in LEVELS:
    raise DataError(f'unknown text level {level!r} (data.level): choose one of '
                    f'{", ".join(LEVELS)}')
  tokenize = Vocab((), kind=level).tokenize
  tokens = {split: [token for line in lines[split] for token in [*tokenize(line.rstrip('\n')),
                                                                  EOS]]
            for split in SPLITS}
  empty = [split for split in SPLITS if len(tokens[split]) < 2]
  if empty:
    raise DataError(f'the {empty[0]} split of {name} has no text')
  index: dict[str, int] = {}
  for split in SPLITS:
    for token in tokens[split]:
      index.setdefault(token, len(index))
  streams = {split: np.fromiter((index[t] for t in tokens[split]), np.int32)
             for split in SPLITS}
  return Corpus(name=name, vocab=Vocab(tuple(index), kind=level), unit=level, **streams)


def load_text_folder(folder: str | os.PathLike, level: str = 'word') -> Corpus:
  """The corpus of FOLDER/train.txt, valid.txt and test.txt (UTF-8)."""
  folder = pathlib.Path(folder)
  lines = {}
  for split in SPLITS:
    path = folder / f'{split}.txt'
    if not path.is_file():
      raise DataError(f'missing data file {path}: a text corpus (data.name=text) is a folder '
                      'holding train.txt, valid.txt and test.txt (data.data_dir)')
    try:
      lines[split] = path.read_text('utf-8').splitlines()
    except UnicodeDecodeError as err:
      raise DataError(f'data file {path} is not UTF-8 text (undecodable byte at offset '
                      f'{err.start})') from None
  return text_corpus(str(folder), lines, level)


def load_tfds_text(dataset: str, data_dir: str | os.PathLike | None = None,
                   feature: str = 'text', splits: Iterable[str] = ('train', 'valid', 'test'),
                   level: str = 'word') -> Corpus:
  """The corpus of a TFDS dataset's `feature` (strings, one sentence each),
  its splits named by `splits` (in our order train, valid, test), read as
  random-access data sources (ArrayRecord; tensorflow-datasets, not
  TensorFlow). For example the `lm_zoo_corpus/ptb` that `lm-zoo-download
  --tfds_dir` writes, or `lm1b` prepared as ArrayRecord."""
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise DataError("a TFDS corpus needs tensorflow-datasets: pip install 'lm_zoo[tfds]'"
                    ) from None
  names = tuple(splits)
  if len(names) != len(SPLITS):
    raise DataError(f'data.tfds_splits must name the dataset\'s train, valid and test '
                    f'splits, got {names}')
  try:
    source = tfds.data_source(dataset, data_dir=data_dir)
    lines = {ours: [_text(example[feature]) for example in source[theirs]]
             for ours, theirs in zip(SPLITS, names)}
  except (KeyError, ValueError, FileNotFoundError, OSError) as err:
    raise DataError(f'cannot read the {feature!r} text of the TFDS dataset {dataset} '
                    f'(splits {", ".join(names)}) from {data_dir or "the default folder"}: '
                    f'{err}') from None
  return text_corpus(dataset, lines, level)


def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)
