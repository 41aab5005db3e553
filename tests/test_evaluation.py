"""Evaluation scores every token once at any batch size, as a direct sum would;
softmax temperature and Monte-Carlo dropout evaluation."""

import functools
import math

import jax
import numpy as np
import pytest
from conftest import perturb

from lm_zoo.cells import ALSTMCell, LSTMCell
from lm_zoo.evaluation import (
  EvalResult,
  Static,
  TunedTemperature,
  evaluate_stream,
  make_eval_step,
  make_mc_dropout_eval_step,
  mc_dropout_carries,
  token_losses,
  tune_temperature,
)
from lm_zoo.generation import sample
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params

V = 13
STREAM = np.random.default_rng(0).integers(0, V, 101).astype(np.int32)


def _model(dropout_input=0.0, make_cell=LSTMCell, **stack):
  return RecurrentLM(
    Embedding(V, 5, dropout=dropout_input), Stack([make_cell(6), make_cell(6)], **stack), Softmax(V)
  )


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# Run op by op, a model's pass would compile each of its operations alone; jitted
# with the model static, equal models of equal shapes compile once in the file.
@functools.partial(jax.jit, static_argnames=('model', 'train'))
def _apply(model, params, tokens, train=False, dropout_key=None):
  """model.apply on `tokens` from the zero state; the logits."""
  rngs = {'dropout': dropout_key} if train else None
  logits, _ = model.apply(
    {'params': params}, tokens, model.initialize_carry(tokens.shape[0]), train=train, rngs=rngs
  )
  return logits


def _nll(logits, targets):
  """Each target's negative log-probability under `logits`, in NumPy."""
  return -np.take_along_axis(
    _log_softmax(np.asarray(logits, np.float64)), targets[:, None], axis=1
  )[:, 0]


def test_batch_sizes_agree_with_one_pass():
  model = RecurrentLM(Embedding(13, 5), Stack([LSTMCell(6)]), Softmax(13))
  params = init_params(model, jax.random.key(0))
  stream = np.random.default_rng(0).integers(0, 13, 101).astype(np.int32)
  direct = float(_nll(_apply(model, params, stream[None, :-1])[0], stream[1:]).mean())
  step = make_eval_step(model)
  for bptt in (100, 7):
    result = evaluate_stream(step, params, model.initialize_carry(1), stream, 1, bptt)
    assert result.num_tokens == 100
    np.testing.assert_allclose(result.loss, direct, rtol=1e-5)
  # four rows of 25 pairs, each scored from a zero state as its own stream
  rows = [stream[25 * b : 25 * b + 26] for b in range(4)]
  per_row = []
  for row in rows:
    per_row.append(_nll(_apply(model, params, row[None, :-1])[0], row[1:]))
  result = evaluate_stream(step, params, model.initialize_carry(4), stream, 4, 9)
  assert result.num_tokens == 100
  np.testing.assert_allclose(result.loss, float(np.mean(np.concatenate(per_row))), rtol=1e-5)
  # One program per batch size and bptt: a pass's short last window (2 of
  # 7, 7 of 9) comes padded to the others' shape, its padding unscored.
  assert step._cache_size() == 3


def test_token_losses_are_each_tokens_nll_given_the_whole_prefix():
  model = _model()
  params = perturb(init_params(model, jax.random.key(0)))
  # One pass over the whole stream, the log-softmax written again in NumPy.
  expected = _nll(_apply(model, params, STREAM[None, :-1])[0], STREAM[1:])
  losses = token_losses(model, params, STREAM, bptt=7)  # 15 windows, state carried
  assert losses.shape == (100,)
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  total = evaluate_stream(make_eval_step(model), params, model.initialize_carry(1), STREAM, 1, 7)
  np.testing.assert_allclose(losses.mean(), total.loss, rtol=1e-6)


def test_units():
  r = EvalResult(loss=math.log(2) * 1.5, num_tokens=10, unit='char')
  assert math.isclose(r.bits_per_token, 1.5)
  assert 'bits per character 1.5000' in r.summary()
  assert EvalResult(loss=math.log(100.0), num_tokens=1).summary() == 'perplexity 100.00'


def test_temperature_divides_the_logits():
  model = _model()
  params = perturb(init_params(model, jax.random.key(0)))
  logits = _apply(model, params, STREAM[None, :-1])
  step = make_eval_step(model)
  for temperature in (0.7, 1.3):
    direct = -np.mean(
      np.take_along_axis(
        _log_softmax(np.asarray(logits[0], np.float64) / temperature), STREAM[1:, None], axis=1
      )
    )
    result = evaluate_stream(
      step, params, model.initialize_carry(1), STREAM, 1, 20, temperature=temperature
    )
    np.testing.assert_allclose(result.loss, direct, rtol=1e-5)


def test_mc_dropout_without_dropout_is_deterministic_evaluation():
  model = _model()
  params = perturb(init_params(model, jax.random.key(0)))
  plain = evaluate_stream(make_eval_step(model), params, model.initialize_carry(2), STREAM, 2, 9)
  mc = evaluate_stream(
    make_mc_dropout_eval_step(model, 4),
    params,
    mc_dropout_carries(model, 2, 4, jax.random.key(1)),
    STREAM,
    2,
    9,
  )
  np.testing.assert_allclose(mc.loss, plain.loss, rtol=1e-5)
  assert mc.num_tokens == plain.num_tokens == 100


def test_mc_dropout_averages_probabilities_over_masks():
  model = _model(dropout_input=0.3, dropout_hidden=0.3, dropout_output=0.3, weight_drop=0.3)
  params = perturb(init_params(model, jax.random.key(0)))
  inputs, targets = STREAM[None, :-1], STREAM[None, 1:]
  step = make_mc_dropout_eval_step(model, 3)
  total, count, _ = step(
    params,
    mc_dropout_carries(model, 1, 3, jax.random.key(5)),
    inputs,
    targets,
    np.ones_like(targets, np.float32),
  )
  # The same three masks drawn by hand: the window key, then one key per sample.
  _, window_key = jax.random.split(jax.random.key(5))
  probs, nlls = [], []
  for key in jax.random.split(window_key, 3):
    weight_key, dropout_key = jax.random.split(key)
    logits = _apply(
      model,
      jax.jit(model.dropped_weights)(params, weight_key),
      inputs,
      train=True,
      dropout_key=dropout_key,
    )
    log_p = _log_softmax(np.asarray(logits[0], np.float64))
    picked = np.take_along_axis(log_p, targets[0, :, None], axis=1)[:, 0]
    probs.append(np.exp(picked))
    nlls.append(-picked.mean())
  expected = -np.mean(np.log(np.mean(probs, axis=0)))
  np.testing.assert_allclose(total / count, expected, rtol=1e-5)
  assert len({round(n, 6) for n in nlls}) == 3  # the masks differ
  assert total / count <= np.mean(nlls)  # Jensen: mixing never costs


def test_dropout_multiplier_scales_every_rate():
  model = _model(dropout_input=0.2, dropout_state=0.1, weight_drop=0.4)
  scaled = model.with_dropout_scaled(1.5)
  assert (
    scaled.embedding.dropout,
    scaled.stack.dropout_state,
    scaled.stack.weight_drop,
    scaled.stack.dropout_output,
  ) == pytest.approx((0.3, 0.15, 0.6, 0.0))
  with pytest.raises(ValueError, match='outside'):
    model.with_dropout_scaled(3.0)
  # The aLSTM's latent dropout is a field of its cells, not of the model.
  alstm = _model(make_cell=functools.partial(ALSTMCell, latent_size=4, dropout_latent=0.3))
  scaled = alstm.with_dropout_scaled(2.0)
  assert [(c.latent_size, c.dropout_latent) for c in scaled.stack.cells] == [(4, 0.6)] * 2
  assert alstm.stack.cells[0].dropout_latent == 0.3
  with pytest.raises(ValueError, match='dropout_latent'):
    alstm.with_dropout_scaled(4.0)
  with pytest.raises(ValueError, match='at least one'):
    make_mc_dropout_eval_step(model, 0)


@pytest.mark.parametrize('true_temperature', [0.7, 1.4])
def test_tuned_temperature_recovers_the_sampling_temperature(true_temperature):
  """On text sampled from the model at temperature T*, the validation loss is
  lowest near T*; the search lands where a grid of real evaluations does."""
  model = _model()
  params = perturb(init_params(model, jax.random.key(0)))
  params['head']['kernel'] = params['head']['kernel'] * 3  # peaked predictions
  sampled = sample(
    model, params, np.zeros((1, 1)), 1500, jax.random.key(1), temperature=true_temperature
  )[0]
  stream = np.concatenate([[0], sampled]).astype(np.int32)
  step = make_eval_step(model)
  loss_at = lambda t: (
    evaluate_stream(step, params, model.initialize_carry(1), stream, 1, 100, temperature=t).loss
  )
  grid = np.linspace(0.5, 2.0, 31)
  losses = [loss_at(t) for t in grid]
  tuned = tune_temperature(loss_at, 0.5, 2.0, tolerance=0.01)
  assert abs(tuned - grid[int(np.argmin(losses))]) <= 0.05
  assert loss_at(tuned) <= min(losses) + 1e-4
  assert abs(tuned - true_temperature) < 0.15 * true_temperature


def test_tune_temperature_bad_range():
  with pytest.raises(ValueError, match='low < high'):
    tune_temperature(lambda t: t, 2.0, 0.5)


@pytest.mark.parametrize('best', [0.3, 1.2, 3.0])
def test_a_tuned_temperature_at_the_edge_of_its_range_is_warned_of(monkeypatch, caplog, best):
  """The search can only return a temperature in [low, high]: where the
  loss falls on beyond an end, the log says the range cut it short."""
  monkeypatch.setattr(
    Static,
    'score',
    lambda self, prepared, split: EvalResult((1 / self.temperature - 1 / best) ** 2, 1),
  )
  with caplog.at_level('INFO', logger='lm_zoo.evaluation.evaluators'):
    chosen = TunedTemperature(Static(5), 0.5, 2.0, 0.01).prepare(None, None, None).choice
  assert chosen == pytest.approx(min(max(best, 0.5), 2.0), abs=0.01)
  at_edge = [r for r in caplog.records if 'edge of [0.5, 2]' in r.getMessage()]
  assert [r.levelname for r in at_edge] == ([] if best == 1.2 else ['WARNING'])
