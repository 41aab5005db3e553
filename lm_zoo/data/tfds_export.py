"""The text corpora as TFDS datasets in ArrayRecord files, without TensorFlow.

`build_tfds_dataset('ptb', data_dir, tfds_dir)` (or `lm-zoo-download
--datasets=ptb --tfds_dir=TFDS_DIR`) writes the dataset `lm_zoo_corpus` with
one config per corpus ('ptb', 'wikitext2', 'ptb_char') to
TFDS_DIR/lm_zoo_corpus/CORPUS/1.0.0/: splits 'train', 'valid', 'test', one
example per line of the text file, in file order (shuffling is off, so a
split read in index order is the corpus stream):

  ids:  int32 (n,), the line's token ids ending in <eos>; the same ids as
        `load_corpus` gives, so concatenating a split's examples gives its stream.
  text: the line as the file holds it (UTF-8 bytes when read back).

The vocabulary is written beside the ArrayRecord files, in metadata.json:
`builder.info.metadata['tokens']` (id order) and `['kind']`; `tfds_vocab`
turns them into a `Vocab` for decoding.

Reading needs tensorflow-datasets and array_record, not TensorFlow:

  import tensorflow_datasets as tfds
  source = tfds.data_source('lm_zoo_corpus/ptb', data_dir=TFDS_DIR)
  source['valid'][0]  # {'ids': array([...], dtype=int32), 'text': b'...'}
  # or tfds.builder_from_directory(TFDS_DIR + '/lm_zoo_corpus/ptb/1.0.0').as_data_source()
  # grain (not an lm_zoo dependency) streams a split:
  # grain.MapDataset.source(source['train']).map(lambda e: e['ids'])...

tfds' `GeneratorBasedBuilder` writes ArrayRecord without TensorFlow: it
serialises examples with its own copy of the tf.train.Example protos and
writes them with array_record. (`tfds.dataset_builders.store_as_tfds_dataset`
cannot: it checks its inputs against tf.data.Dataset, which imports
TensorFlow.)
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np
import tensorflow_datasets as tfds

from lm_zoo.data.corpora import CORPORA, SPLITS, load_corpus, resolve_data_dir
from lm_zoo.data.vocab import EOS, Vocab
from lm_zoo.errors import DataError

VERSION = '1.0.0'
TEXT_CORPORA = tuple(name for name, (_, kind) in CORPORA.items() if kind != 'byte')


def _text_lines(path: pathlib.Path) -> list[str]:
  """The lines of a corpus file, split as `load_corpus` splits them."""
  text = path.read_text(encoding='utf-8').replace('\r\n', '\n').replace('\r', '\n')
  lines = text.split('\n')
  if lines[-1] == '':
    lines.pop()
  return lines


class LmZooCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A corpus of `load_corpus` as a TFDS dataset: one example per line."""

  VERSION = tfds.core.Version(VERSION)
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in TEXT_CORPORA]

  def __init__(self, *, corpus_name: str, source_dir: pathlib.Path, **kwargs):
    self._folder = source_dir / CORPORA[corpus_name][0]
    self._corpus = load_corpus(corpus_name, source_dir)
    super().__init__(config=corpus_name, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=f'{self._corpus.name} for language modelling: one example per '
      'line, ids ending in <eos>; vocabulary in metadata.json.',
      features=tfds.features.FeaturesDict(
        {
          'ids': tfds.features.Tensor(shape=(None,), dtype=np.int32),
          'text': tfds.features.Text(),
        }
      ),
      metadata=tfds.core.MetadataDict(
        tokens=list(self._corpus.vocab.tokens), kind=self._corpus.vocab.kind, unit=self._corpus.unit
      ),
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the corpus is read from the data folder
    return {split: self._generate_examples(split) for split in SPLITS}

  def _generate_examples(self, split: str):
    stream = self._corpus.split(split)
    ends = np.flatnonzero(stream == self._corpus.vocab.id(EOS)) + 1
    lines = _text_lines(self._folder / f'{split}.txt')
    # Each line of the file gives one <eos>, so the two must pair up.
    assert len(lines) == len(ends), (split, len(lines), len(ends))
    for index, (ids, text) in enumerate(zip(np.split(stream, ends[:-1]), lines)):
      yield index, {'ids': ids, 'text': text}


def build_tfds_dataset(
  corpus_name: str, data_dir: str | os.PathLike | None, output_dir: str | os.PathLike
) -> pathlib.Path:
  """Writes corpus `corpus_name` of `data_dir` (`resolve_data_dir`) as the
  TFDS dataset 'lm_zoo_corpus/CORPUS' in ArrayRecord files under `output_dir`.

  An already prepared dataset is kept as it is.

  Returns:
    The dataset's folder, OUTPUT_DIR/lm_zoo_corpus/CORPUS/1.0.0, which
    `tfds.builder_from_directory` opens.
  """
  if corpus_name not in TEXT_CORPORA:
    raise DataError(f'no TFDS export for {corpus_name!r}: choose from {", ".join(TEXT_CORPORA)}')
  builder = LmZooCorpus(
    corpus_name=corpus_name,
    source_dir=resolve_data_dir(data_dir),
    data_dir=output_dir,
    file_format='array_record',
  )
  # Nothing is downloaded: a temporary download folder keeps tfds from leaving
  # an empty one in output_dir, and no lookup of a prebuilt copy on GCS.
  with tempfile.TemporaryDirectory() as downloads:
    builder.download_and_prepare(
      download_dir=downloads, download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
  return pathlib.Path(builder.data_dir)


def tfds_vocab(builder: tfds.core.DatasetBuilder) -> Vocab:
  """The vocabulary of a dataset written by `build_tfds_dataset`."""
  return Vocab(tuple(builder.info.metadata['tokens']), kind=builder.info.metadata['kind'])
