"""PTB written as a TFDS ArrayRecord dataset and read back through tfds, without TensorFlow."""

import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import run_script

from lm_zoo.data import EOS, load_corpus
from lm_zoo.data.tfds_export import build_tfds_dataset, tfds_vocab
from lm_zoo.errors import DataError

# Published PTB statistics: lines, and tokens including one <eos> a line.
PTB_LINES = {'train': 42_068, 'valid': 3_370, 'test': 3_761}
PTB_TOKENS = {'valid': 73_760, 'test': 82_430}


@pytest.fixture(scope='module')
def ptb_tfds(data_dir, tmp_path_factory):
  """(the TFDS folder, the prepared dataset's folder) of the whole of PTB."""
  tfds_dir = tmp_path_factory.mktemp('tfds')
  return tfds_dir, build_tfds_dataset('ptb', data_dir, tfds_dir)


def test_counts_match_published_statistics(ptb_tfds):
  tfds_dir, path = ptb_tfds
  assert path == tfds_dir / 'lm_zoo_corpus' / 'ptb' / '1.0.0'
  assert sorted(p.name for p in tfds_dir.iterdir()) == ['lm_zoo_corpus']
  source = tfds.data_source('lm_zoo_corpus/ptb', data_dir=tfds_dir)
  for split, lines in PTB_LINES.items():
    assert len(source[split]) == lines, split
  # Reading train one example at a time takes seconds; valid and test suffice.
  for split, tokens in PTB_TOKENS.items():
    assert sum(len(example['ids']) for example in source[split]) == tokens, split
  assert 'tensorflow' not in sys.modules


@pytest.mark.parametrize('split', ['valid', 'test'])
def test_examples_decode_to_the_lines(ptb_tfds, data_dir, split):
  _, path = ptb_tfds
  builder = tfds.builder_from_directory(path)
  vocab = tfds_vocab(builder)
  corpus = load_corpus('ptb', data_dir)
  assert vocab == corpus.vocab
  lines = (data_dir / 'ptb' / f'{split}.txt').read_text().splitlines()
  examples = list(builder.as_data_source(split=split))
  assert len(examples) == len(lines)
  for example, line in zip(examples, lines):
    assert example['ids'].dtype == np.int32
    assert example['text'].decode() == line
    assert vocab.tokens[example['ids'][-1]] == EOS
    assert vocab.decode(example['ids'][:-1]) == ' '.join(line.split())
  # In index order the examples are the stream load_corpus gives.
  np.testing.assert_array_equal(np.concatenate([e['ids'] for e in examples]), corpus.split(split))


def test_prepared_dataset_is_kept(ptb_tfds, data_dir):
  tfds_dir, path = ptb_tfds
  info = path / 'dataset_info.json'
  written = info.stat().st_mtime_ns
  assert build_tfds_dataset('ptb', data_dir, tfds_dir) == path
  assert info.stat().st_mtime_ns == written


def test_only_text_corpora(data_dir, tmp_path):
  with pytest.raises(DataError, match="no TFDS export for 'enwik8'"):
    build_tfds_dataset('enwik8', data_dir, tmp_path)


def test_command_skips_mnist(data_dir, tmp_path):
  run = run_script(
    ['launch/download.py', '--datasets=mnist', '--verify_only', f'--tfds_dir={tmp_path}'],
    {'LM_ZOO_DATA': str(data_dir)},
  )
  assert run.returncode == 0, run.stderr
  assert run.stdout.splitlines() == ['mnist: ok', 'mnist: no TFDS export (text corpora only)']
