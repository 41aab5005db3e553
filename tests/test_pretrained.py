"""lm_zoo.load: a trained model used without its data, its scores held
against the model applied by hand."""

import shutil

import jax
import numpy as np
import optax
import pytest

import lm_zoo
from lm_zoo.errors import ConfigError
from lm_zoo.generation import UnknownTokensWarning
from lm_zoo.training import train_and_evaluate

TEXT = 'the company said it expects higher sales\nshares rose in new york trading'


@pytest.fixture(scope='module')
def moved_run(tmp_path_factory, data_dir):
  """A tiny trained run, moved to a folder of its own: no data beside it."""
  from conftest import tiny_lm_config

  run = tmp_path_factory.mktemp('trained') / 'run'
  config = tiny_lm_config(data_dir)
  config.train.num_epochs = 1
  train_and_evaluate(config, run)
  moved = tmp_path_factory.mktemp('elsewhere') / 'run'
  shutil.move(str(run), moved)
  return moved


@pytest.fixture
def model(moved_run, monkeypatch, tmp_path):
  monkeypatch.setenv('LM_ZOO_DATA', str(tmp_path / 'no_data_here'))
  return lm_zoo.load(moved_run)


def test_score_is_the_mean_loss_of_each_token_given_the_text_before_it(model):
  ids = model.encode(TEXT)
  eos, unk = model.vocab.id('<eos>'), model.vocab.id('<unk>')
  assert ids[0] == eos and list(ids).count(eos) == 3 and unk not in ids
  logits, _ = model.model.apply(
    {'params': model.params}, ids[None, :-1], model.model.initialize_carry(1)
  )
  expected = optax.softmax_cross_entropy_with_integer_labels(logits[0], ids[1:])
  tokens, losses = model.token_losses(TEXT)
  assert tokens[:2] == ['the', 'company'] and tokens[-1] == '<eos>'
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  result = model.score(TEXT)
  assert result.num_tokens == len(ids) - 1
  np.testing.assert_allclose(result.loss, float(np.mean(expected)), rtol=1e-5)


def test_words_outside_the_vocabulary_are_unk_and_counted(model):
  assert model.vocab.id('<unk>') in model.encode('the xyzzy said')
  assert model.score('the xyzzy said plugh').details['unknown_tokens'] == 2
  # PTB's own <unk> tokens are in the vocabulary: written out, they are not unknown.
  assert model.score('the <unk> said').details['unknown_tokens'] == 0
  with pytest.warns(UnknownTokensWarning, match=r"1 token\(s\) outside .* 'xyzzy'"):
    model.generate('the xyzzy', num_tokens=2)


def test_a_dynamic_evaluation_s_result_prints_as_its_score_not_its_weights(model):
  result = model.dynamic_evaluate(TEXT, learning_rate=0.01)
  assert result.details['static_loss'] > 0  # the details are there, the adapted weights too
  shown = repr(result)
  assert shown == (
    f'EvalResult(loss={result.loss!r}, num_tokens={result.num_tokens!r}, '
    f'unit={result.unit!r}, temperature={result.temperature!r})'
  )


def test_generation_continues_the_prompt(model):
  texts = model.generate('the company', num_tokens=5, num_samples=2, seed=1)
  assert len(texts) == 2 and all(text.startswith('the company') for text in texts)


def test_dynamic_evaluation_at_rate_zero_is_the_static_score(model):
  result = model.dynamic_evaluate(TEXT, learning_rate=0.0)
  np.testing.assert_allclose(result.loss, model.score(TEXT).loss, rtol=1e-5)
  assert result.details['static_loss'] == model.score(TEXT).loss
  adapted = model.dynamic_evaluate(TEXT, learning_rate=1.0).details['params']
  assert any(
    not np.allclose(a, b) for a, b in zip(jax.tree.leaves(adapted), jax.tree.leaves(model.params))
  )


def test_a_run_without_its_vocabulary_names_the_missing_file(moved_run, tmp_path):
  damaged = tmp_path / 'damaged'
  shutil.copytree(moved_run, damaged)
  (damaged / 'vocab.json').unlink()
  with pytest.raises(
    ConfigError, match=f'{damaged}/vocab.json is missing: every work directory keeps its vocabulary'
  ):
    lm_zoo.load(damaged)
