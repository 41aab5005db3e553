"""Every feature of a run alone on the seed axis: validation within epochs,
averaging, fine-tuning, skipping and rolling back non-finite updates,
variable BPTT and data parallelism, each trained with two seeds at once and
checked against the same seed's run alone (tests/test_stacked.py holds the
rest: schedules, state drop, resuming, signals); and the step of one seed on
the seed axis against the step of a run alone."""

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import users_compile_env

from lm_zoo.cells import LSTMCell
from lm_zoo.data import load_data
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.runs import read_metrics
from lm_zoo.training import TrainState, loop, make_train_step, train_and_evaluate
from lm_zoo.training import state as train_state
from lm_zoo.training.seed_axis import stack


@pytest.fixture
def tiny_config(tiny_config):
  tiny_config.generate.num_lines = 0  # no sampler to compile
  tiny_config.train.num_epochs = 1
  return tiny_config


def _alone(config, seed, workdir):
  alone = config.copy_and_resolve_references()
  alone.seed = seed
  return train_and_evaluate(alone, workdir, final_splits=('valid',))


def _valid_records(workdir, seed=None):
  return [
    (r['step'], r['averaged'], r['loss'])
    for r in read_metrics(workdir / 'metrics.jsonl')
    if r['kind'] == 'valid' and not r.get('final') and r.get('seed') == seed
  ]


def _assert_same_records(stacked, alone):
  assert [r[:2] for r in stacked] == [r[:2] for r in alone]
  np.testing.assert_allclose([r[2] for r in stacked], [r[2] for r in alone], rtol=1e-4)


def _assert_same_run(stacked_run, alone_summary):
  for key in ('best_epoch', 'skipped_updates', 'rollbacks', 'step'):
    assert stacked_run[key] == alone_summary[key], key
  np.testing.assert_allclose(
    stacked_run['valid']['loss'], alone_summary['valid']['loss'], rtol=1e-4
  )


def test_validation_within_epochs_scores_each_seed_as_alone(tiny_config, tmp_path):
  tiny_config.train.update(eval_every=4, num_epochs=2)
  stack = train_and_evaluate(tiny_config, tmp_path / 'stack', final_splits=('valid',), num_seeds=2)
  expected = _alone(tiny_config, 1, tmp_path / 'alone')
  _assert_same_run(stack['runs'][1], expected)
  stacked = _valid_records(tmp_path / 'stack', seed=1)
  assert [step for step, _, _ in stacked] == [4, 8, 10, 12, 16, 20]  # and each epoch's end
  _assert_same_records(stacked, _valid_records(tmp_path / 'alone'))


def test_each_seed_starts_averaging_at_its_own_epoch(tiny_config, tmp_path):
  # At this rate seed 3 validates worse after epoch 2 than after epoch 1 and
  # seed 4 better (tests/test_stacked.py), so the plateau trigger starts
  # seed 3's averaging after epoch 2 and not seed 4's.
  tiny_config.update_from_flattened_dict(
    {
      'optimizer.learning_rate': 10.0,
      'seed': 3,
      'train.num_epochs': 3,
      'averaging.trigger': 'plateau',
    }
  )
  stack = train_and_evaluate(tiny_config, tmp_path / 'stack', final_splits=('valid',), num_seeds=2)
  assert [averaged for _, averaged, _ in _valid_records(tmp_path / 'stack', seed=3)] == [
    False,
    False,
    True,
  ]
  stacked = _valid_records(tmp_path / 'stack', seed=4)
  assert not any(averaged for _, averaged, _ in stacked)
  expected = _alone(tiny_config, 4, tmp_path / 'alone')
  _assert_same_run(stack['runs'][1], expected)
  _assert_same_records(stacked, _valid_records(tmp_path / 'alone'))


def test_every_seed_fine_tunes_the_same_weights(tiny_config, tmp_path):
  _alone(tiny_config, 0, tmp_path / 'first')
  tiny_config.train.init_from = str(tmp_path / 'first')
  stack = train_and_evaluate(tiny_config, tmp_path / 'stack', final_splits=('valid',), num_seeds=2)
  expected = _alone(tiny_config, 1, tmp_path / 'alone')
  _assert_same_run(stack['runs'][1], expected)
  _assert_same_records(
    _valid_records(tmp_path / 'stack', seed=1), _valid_records(tmp_path / 'alone')
  )


def _rare_token(config):
  """A token id seen in the training split at most twice and in no other
  (not 0, which pads the windows a batch's rows do not fill)."""
  corpus = load_data(config)
  counts = np.bincount(corpus.train, minlength=len(corpus.vocab))
  elsewhere = np.bincount(np.concatenate([corpus.valid, corpus.test]), minlength=len(corpus.vocab))
  return int(np.flatnonzero((counts > 0) & (counts <= 2) & (elsewhere == 0))[-1])


def test_a_seed_skips_its_own_non_finite_updates(tiny_config, tmp_path, monkeypatch):
  # Seed 1's embedding of a rare token is NaN: the windows with it are not
  # finite for seed 1 alone, which skips them as its run alone does.
  token = _rare_token(tiny_config)
  original = train_state.create_train_state

  def seed_1_poisoned(model, optimizer, config):
    state = original(model, optimizer, config)
    if config.seed == 1:
      embedding = state.params['embedding']['embedding']
      params = {**state.params, 'embedding': {'embedding': embedding.at[token].set(np.nan)}}
      state = state.replace(params=params, opt_state=optimizer.init(params))
    return state

  monkeypatch.setattr(train_state, 'create_train_state', seed_1_poisoned)
  tiny_config.train.nonfinite = 'skip'
  stack = train_and_evaluate(tiny_config, tmp_path / 'stack', final_splits=('valid',), num_seeds=2)
  expected = _alone(tiny_config, 1, tmp_path / 'alone')
  assert stack['runs'][0]['skipped_updates'] == 0
  assert stack['runs'][1]['skipped_updates'] == expected['skipped_updates'] > 0
  assert all(math.isfinite(run['valid']['loss']) for run in stack['runs'])
  _assert_same_run(stack['runs'][1], expected)


def _fault_once(monkeypatch, step, seed_index):
  """The train step reports update `step` of the seed at `seed_index` not
  finite, the first time it is taken."""
  make_train_step = loop.make_train_step

  def faulty_make_train_step(*args, **kwargs):
    train_step, faulted = make_train_step(*args, **kwargs), []

    def faulty(state, *batch):
      new_state, metrics = train_step(state, *batch)
      if int(new_state.step[0]) == step and not faulted:
        faulted.append(step)
        metrics = {**metrics, 'finite': metrics['finite'].at[seed_index].set(False)}
      return new_state, metrics

    return faulty

  monkeypatch.setattr(loop, 'make_train_step', faulty_make_train_step)


def test_a_rollback_lowers_only_the_faulty_seed_rate(tiny_config, tmp_path, monkeypatch):
  tiny_config.train.update(nonfinite='rollback', rollback_lr_factor=0.5, checkpoint_every=2)
  unfaulted = _alone(tiny_config, 0, tmp_path / 'seed_0')
  _fault_once(monkeypatch, 3, 1)
  stack = train_and_evaluate(tiny_config, tmp_path / 'stack', final_splits=('valid',), num_seeds=2)
  _fault_once(monkeypatch, 3, 0)
  expected = _alone(tiny_config, 1, tmp_path / 'seed_1')
  assert [run['rollbacks'] for run in stack['runs']] == [0, 1]
  _assert_same_run(stack['runs'][0], unfaulted)  # retrained as it had trained
  _assert_same_run(stack['runs'][1], expected)
  rates = {
    seed: [
      r['learning_rate']
      for r in read_metrics(tmp_path / 'stack' / 'metrics.jsonl')
      if r['kind'] == 'train' and r['seed'] == seed
    ]
    for seed in (0, 1)
  }
  assert rates == {0: [0.5, 0.5], 1: [0.25, 0.25]}
  (record,) = [
    r for r in read_metrics(tmp_path / 'stack' / 'metrics.jsonl') if r['kind'] == 'nonfinite'
  ]
  assert (record['seed'], record['step'], record['to_step']) == (1, 3, 2)


def test_variable_bptt_draws_config_seed_windows_for_every_seed(tiny_config, tmp_path):
  tiny_config.data.update(variable_bptt=True, pad_windows_to=8)
  # Rows of 50 tokens: seed 0's draw is 5 windows of 4 lengths (2 padded
  # shapes), against 5 windows of 10 tokens had the stack drawn none.
  tiny_config.data.train_tokens = 201
  stack = train_and_evaluate(tiny_config, tmp_path / 'stack', final_splits=('valid',), num_seeds=2)
  expected = _alone(tiny_config, 0, tmp_path / 'alone')
  _assert_same_run(stack['runs'][0], expected)
  assert stack['step'] == expected['step']


@pytest.mark.skipif(jax.device_count() < 2, reason='needs 2 (simulated) devices')
def test_seeds_train_data_parallel_as_on_one_device(tiny_config, tmp_path):
  one = train_and_evaluate(tiny_config, tmp_path / 'one', final_splits=('valid',), num_seeds=2)
  tiny_config.parallel.num_devices = 2
  two = train_and_evaluate(tiny_config, tmp_path / 'two', final_splits=('valid',), num_seeds=2)
  for a, b in zip(one['runs'], two['runs']):
    np.testing.assert_allclose(a['valid']['loss'], b['valid']['loss'], rtol=1e-4)
    assert math.isfinite(b['valid']['loss'])


def _two_steps(step, state, inputs, targets, weights):
  for _ in range(2):
    state, metrics = step(state, inputs, targets, weights)
  return jax.tree.map(np.asarray, (state, metrics))


def test_one_seed_on_the_seed_axis_takes_the_step_of_a_run_alone_bit_for_bit():
  if os.environ.get('LM_ZOO_TEST_COMPILE') != 'default':
    # Bit for bit as users compile: conftest's CPU compile flags fuse the seed
    # axis' squeeze around the step differently, which moves a last bit.
    test = f'{__file__}::test_one_seed_on_the_seed_axis_takes_the_step_of_a_run_alone_bit_for_bit'
    ran = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:xdist', '-p', 'no:cacheprovider', test],
      capture_output=True,
      text=True,
      env=users_compile_env(),
      timeout=600,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return
  model = RecurrentLM(Embedding(7, 4, dropout=0.3), Stack([LSTMCell(4)]), Softmax(7))
  params = init_params(model, jax.random.key(0))
  optimizer = optax.adam(0.1)
  state = TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    carries=model.initialize_carry(2),
    rng=jax.random.key_data(jax.random.key(1)),
  )
  batch = (
    jnp.array([[1, 2, 6], [3, 4, 5]], jnp.int32),
    jnp.ones((2, 3), jnp.int32),
    jnp.ones((2, 3)),
  )
  one_state, two_state = stack([state]), stack([state, state])  # before it is donated
  alone = _two_steps(make_train_step(model, optimizer), state, *batch)
  one = _two_steps(make_train_step(model, optimizer, stacked=True), one_state, *batch)
  for got, want in zip(jax.tree.leaves(one), jax.tree.leaves(alone)):
    np.testing.assert_array_equal(got, want[None])
  # two seeds of one state: each the run alone, up to the rounding vmap changes
  two = _two_steps(make_train_step(model, optimizer, stacked=True), two_state, *batch)
  for got, want in zip(jax.tree.leaves(two), jax.tree.leaves(alone)):
    np.testing.assert_allclose(got, np.stack([want, want]), rtol=1e-5, atol=1e-6)
