"""Numerical faults injected on purpose: a poisoned training token (an id
past the vocabulary embeds as NaN) or a learning rate that overflows the
weights, under each train.nonfinite policy."""

import dataclasses
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm_zoo.cells import LSTMCell
from lm_zoo.errors import TrainingError
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.runs import read_metrics
from lm_zoo.training import TrainState, loop, make_train_step, train_and_evaluate


def _poison(monkeypatch, position: int):
  """Makes training token `position` an id past the vocabulary, through the
  loop's data loading: its window's loss and gradients are NaN."""
  load_data = loop.load_data

  def poisoned(config):
    corpus = load_data(config)
    train = corpus.train.copy()
    train[position] = len(corpus.vocab) + 5
    return dataclasses.replace(corpus, train=train)

  monkeypatch.setattr(loop, 'load_data', poisoned)


@pytest.fixture
def tiny_config(tiny_config):
  tiny_config.generate.num_lines = 0  # no sampler to compile
  return tiny_config


def _nonfinite_records(workdir):
  return [r for r in read_metrics(workdir / 'metrics.jsonl') if r['kind'] == 'nonfinite']


# tiny_config: 4 rows of 100 pairs, BPTT 10. Token 235 is row 2's time step
# 35 (as an input) and 34 (as a target): window 4 of each epoch, steps 4, 14, 24.
POISONED, POISONED_STEPS = 235, [4, 14, 24]


def test_skip_drops_the_poisoned_updates_and_trains_on(tiny_config, tmp_path, monkeypatch, caplog):
  _poison(monkeypatch, POISONED)
  tiny_config.train.update(nonfinite='skip', num_epochs=2)
  with caplog.at_level(logging.WARNING, 'lm_zoo'):
    summary = train_and_evaluate(tiny_config, tmp_path)
  assert summary['skipped_updates'] == 2 and summary['step'] == 20
  assert math.isfinite(summary['test']['loss'])
  records = _nonfinite_records(tmp_path)
  assert [(r['step'], r['action'], r['skipped_updates']) for r in records] == [
    (4, 'skip', 1),
    (14, 'skip', 2),
  ]
  assert 'step 14: non-finite loss or gradient, update skipped (2 skipped so far)' in caplog.text


def test_stop_is_a_clear_error_at_the_poisoned_step(tiny_config, tmp_path, monkeypatch):
  _poison(monkeypatch, POISONED)
  with pytest.raises(TrainingError, match='not finite at or before step 4 .*nonfinite=skip'):
    train_and_evaluate(tiny_config, tmp_path)
  assert [(r['step'], r['action']) for r in _nonfinite_records(tmp_path)] == [(4, 'stop')]


def test_rollback_lowers_the_rate_and_recovers(tiny_config, tmp_path, caplog):
  # SGD at 1e38 overflows the weights within a step or two; one rollback
  # with the rate x 1e-38 trains at 1 from the last good checkpoint.
  tiny_config.optimizer.learning_rate = 1e38
  tiny_config.train.update(nonfinite='rollback', rollback_lr_factor=1e-38, num_epochs=1)
  with caplog.at_level(logging.WARNING, 'lm_zoo'):
    summary = train_and_evaluate(tiny_config, tmp_path)
  assert summary['rollbacks'] == 1 and summary['step'] == 10
  assert math.isfinite(summary['test']['loss'])
  (record,) = _nonfinite_records(tmp_path)
  assert record['action'] == 'rollback' and record['to_step'] == 0
  assert record['learning_rate_scale'] == pytest.approx(1e-38)
  assert 'rolled back to the checkpoint of step 0 with the learning rate x 1e-38' in caplog.text
  train = [r for r in read_metrics(tmp_path / 'metrics.jsonl') if r['kind'] == 'train']
  assert train[-1]['learning_rate'] == pytest.approx(1.0)


def test_rollback_stops_when_the_fault_comes_back(tiny_config, tmp_path, monkeypatch):
  _poison(monkeypatch, POISONED)  # the same window fails at every retry
  tiny_config.train.update(nonfinite='rollback', max_rollbacks=1)
  with pytest.raises(TrainingError, match=r'step 4 after 1 rollbacks \(train.max_rollbacks=1\)'):
    train_and_evaluate(tiny_config, tmp_path)
  assert [r['action'] for r in _nonfinite_records(tmp_path)] == ['rollback', 'stop']


def test_a_skipped_update_leaves_the_state_as_it_was():
  model = RecurrentLM(Embedding(7, 4), Stack([LSTMCell(4)]), Softmax(7))
  params = init_params(model, jax.random.key(0))
  optimizer = optax.adam(0.1)
  state = TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    carries=model.initialize_carry(2),
    rng=jax.random.key_data(jax.random.key(1)),
  )
  before = jax.tree.map(np.asarray, state)
  step = make_train_step(model, optimizer, skip_nonfinite=True)
  targets, weights = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3))
  poisoned = jnp.array([[1, 2, 99], [3, 4, 5]], jnp.int32)  # 99: past the vocabulary
  state, metrics = step(state, poisoned, targets, weights)
  assert not metrics['finite'] and int(state.step) == 1
  for got, want in zip(jax.tree.leaves(state.replace(step=before.step)), jax.tree.leaves(before)):
    np.testing.assert_array_equal(got, want)
  state, metrics = step(state, poisoned % 7, targets, weights)
  assert metrics['finite'] and int(state.step) == 2
  assert not np.array_equal(
    state.params['embedding']['embedding'], before.params['embedding']['embedding']
  )
