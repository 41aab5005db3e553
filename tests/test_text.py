"""One's own text as a corpus: a folder of plain text files, or a TFDS
dataset's text feature, read as the standard corpora are."""

import numpy as np
import pytest

import lm_zoo
from lm_zoo.data import EOS, load_corpus
from lm_zoo.data.text import load_text_folder, load_tfds_text, text_corpus
from lm_zoo.errors import ConfigError, DataError
from lm_zoo.training import train_and_evaluate

SPLITS = {'train': 'the cat sat\non the mat\n', 'valid': 'the dog sat\n', 'test': 'a cat\n'}


def _folder(folder, splits=SPLITS):
  """`folder` (made if need be) holding each split's text file."""
  folder.mkdir(parents=True, exist_ok=True)
  for split, text in splits.items():
    (folder / f'{split}.txt').write_text(text)
  return folder


def test_word_level_text_is_read_as_the_standard_corpora_are(tmp_path, data_dir):
  corpus = load_text_folder(_folder(tmp_path))
  assert corpus.vocab.tokens == ('the', 'cat', 'sat', EOS, 'on', 'mat', 'dog', 'a')
  assert corpus.vocab.decode(corpus.train) == 'the cat sat\non the mat\n'
  assert list(corpus.test) == [7, 1, 3] and corpus.unit == 'word'
  # PTB's own files through the text reader: the same ids and vocabulary.
  ptb = load_text_folder(data_dir / 'ptb')
  standard = load_corpus('ptb', data_dir)
  assert ptb.vocab.tokens == standard.vocab.tokens
  for split in ('train', 'valid', 'test'):
    np.testing.assert_array_equal(ptb.split(split), standard.split(split))


def test_char_level_reads_every_character_spaces_as_underscores(tmp_path):
  corpus = load_text_folder(_folder(tmp_path), level='char')
  assert corpus.vocab.tokens[:5] == ('t', 'h', 'e', '_', 'c') and corpus.unit == 'char'
  assert len(corpus.valid) == len('the dog sat') + 1  # and its <eos>
  assert corpus.vocab.decode(corpus.valid) == 'the dog sat\n'


@pytest.mark.parametrize(
  'splits, message',
  [
    ({**SPLITS, 'test': '\n'}, 'the test split of'),
    ({'train': 'a b\n', 'valid': 'c\n'}, 'missing data file'),
  ],
)
def test_bad_text_folders_are_one_clear_error(tmp_path, splits, message):
  with pytest.raises(DataError, match=message):
    load_text_folder(_folder(tmp_path, splits))
  with pytest.raises(DataError, match='data.level'):
    text_corpus('x', {s: ['a'] for s in ('train', 'valid', 'test')}, 'byte')


def test_a_tfds_datasets_text_is_the_corpus_of_its_lines(tmp_path):
  from lm_zoo.data.tfds_export import build_tfds_dataset

  data = tmp_path / 'data'
  _folder(data / 'ptb')
  build_tfds_dataset('ptb', data, tmp_path / 'tfds')
  corpus = load_tfds_text('lm_zoo_corpus/ptb', tmp_path / 'tfds')
  expected = load_text_folder(data / 'ptb')
  assert corpus.vocab.tokens == expected.vocab.tokens
  for split in ('train', 'valid', 'test'):
    np.testing.assert_array_equal(corpus.split(split), expected.split(split))
  with pytest.raises(DataError, match="cannot read the 'words' text"):
    load_tfds_text('lm_zoo_corpus/ptb', tmp_path / 'tfds', feature='words')


def _capped_by_hand(train, max_size, min_count):
  """The kept words, recounted: at least min_count times in train, the
  max_size - 1 most frequent (ties: first seen), in first-seen order."""
  words = [w for line in train.splitlines() for w in line.split() + [EOS]]
  first = list(dict.fromkeys(words))
  kept = [w for w in first if words.count(w) >= min_count]
  if max_size:
    kept = sorted(kept, key=lambda w: (-words.count(w), first.index(w)))[: max_size - 1]
  return [w for w in first if w in kept]


@pytest.mark.parametrize('max_size, min_count', [(4, 1), (0, 2), (3, 2), (100, 1)])
def test_a_capped_vocabulary_keeps_the_frequent_training_words_and_unks_the_rest(
  max_size, min_count
):
  splits = {'train': 'a b a c\nb a d d\ne a\n', 'valid': 'a z b\n', 'test': 'd c q\n'}
  corpus = text_corpus(
    'toy', {s: t.splitlines() for s, t in splits.items()}, 'word', max_size, min_count
  )
  kept = _capped_by_hand(splits['train'], max_size, min_count)
  assert corpus.vocab.tokens == (*kept, '<unk>')
  for split, text in splits.items():
    words = [w for line in text.splitlines() for w in line.split() + [EOS]]
    want = [w if w in kept else '<unk>' for w in words]
    assert [corpus.vocab.tokens[i] for i in corpus.split(split)] == want


@pytest.mark.parametrize(
  'max_size, min_count, message',
  [
    (1, 1, 'data.max_vocab must be 0'),
    (-3, 1, 'data.max_vocab must be a whole number'),
    (0, 0, 'data.min_count must be a whole number >= 1'),
    (2.5, 1, 'data.max_vocab must be a whole number'),
  ],
)
def test_bad_vocabulary_caps_are_one_clear_error(max_size, min_count, message):
  with pytest.raises(DataError, match=message):
    text_corpus(
      'toy', {s: ['a b'] for s in ('train', 'valid', 'test')}, 'word', max_size, min_count
    )


def test_vocabulary_caps_on_a_standard_corpus_are_refused(tiny_config, tmp_path):
  tiny_config.data.max_vocab = 500
  with pytest.raises(ConfigError, match='data.max_vocab and data.min_count cap'):
    train_and_evaluate(tiny_config, tmp_path / 'run')


def test_a_model_trains_on_a_text_folder_and_scores_new_text(tiny_config, tmp_path):
  folder = _folder(
    tmp_path / 'text',
    {
      'train': 'the cat sat on the mat\n' * 40,
      'valid': 'the cat sat\n' * 5,
      'test': 'on the mat\n' * 5,
    },
  )
  tiny_config.data.update(
    name='text',
    data_dir=str(folder),
    level='char',
    train_tokens=0,
    valid_tokens=0,
    test_tokens=0,
    eval_batch_size=2,
  )
  tiny_config.train.num_epochs = 2
  summary = train_and_evaluate(tiny_config, tmp_path / 'run')
  assert summary['unit'] == 'char' and summary['test']['bits_per_token'] < np.log2(12)
  model = lm_zoo.load(tmp_path / 'run')
  assert model.score('the cat').num_tokens == len('the cat') + 1
  tiny_config.data.data_dir = ''
  with pytest.raises(ConfigError, match='data.data_dir'):
    train_and_evaluate(tiny_config, tmp_path / 'other')
