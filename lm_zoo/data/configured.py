"""The corpus a config names (`load_data`): the `data` section's standard
corpus, folder of text files or TFDS dataset."""

from __future__ import annotations

import dataclasses

import ml_collections

from lm_zoo.data.corpora import SPLITS, Corpus, load_corpus
from lm_zoo.data.text import load_text_folder, load_tfds_text
from lm_zoo.errors import ConfigError


def load_data(config: ml_collections.ConfigDict) -> Corpus:
  """The corpus of `config.data` (a standard corpus, a folder of text files,
  a TFDS dataset's text), cut to the `*_tokens` limits when they are > 0."""
  data = config.data
  if data.name == 'text':
    if not data.data_dir:
      raise ConfigError(
        'data.name=text reads data.data_dir/{train,valid,test}.txt: set '
        '--config.data.data_dir to that folder'
      )
    corpus = load_text_folder(data.data_dir, data.level, data.max_vocab, data.min_count)
  elif data.name == 'tfds':
    if not data.tfds_name:
      raise ConfigError('data.name=tfds needs the dataset: set --config.data.tfds_name')
    corpus = load_tfds_text(
      data.tfds_name,
      data.data_dir or None,
      data.tfds_feature,
      data.tfds_splits,
      data.level,
      data.max_vocab,
      data.min_count,
    )
  else:
    if data.max_vocab or data.min_count != 1:
      raise ConfigError(
        f'data.max_vocab and data.min_count cap the vocabulary of '
        f'data.name=text or tfds; {data.name} comes with its own'
      )
    corpus = load_corpus(data.name, data.data_dir or None)
  limits = {s: config.data.get(f'{s}_tokens', 0) for s in SPLITS}
  return dataclasses.replace(
    corpus, **{s: getattr(corpus, s)[:n] for s, n in limits.items() if n > 0}
  )
