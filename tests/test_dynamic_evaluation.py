"""Dynamic evaluation: each transformation against a hand-written step, decay
toward the trained weights, score-before-update in the scan, and the guards."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import perturb
from lm_zoo.errors import TrainingError
from lm_zoo.models import RecurrentLM, init_params
from lm_zoo.optim import (dynamic_evaluate, dynamic_rms, dynamic_sgd, learned_update_rule,
                          rms_training_gradients)
from lm_zoo.training import evaluate_stream, make_eval_step
from lm_zoo.training.steps import token_nll

V = 11
STREAM = np.random.default_rng(0).integers(0, V, 61).astype(np.int32)
TRAINED = {'a': jnp.array([1.0, -2.0, 0.5]), 'b': jnp.array([[3.0]])}
PARAMS = {'a': jnp.array([1.5, -1.0, 0.0]), 'b': jnp.array([[2.0]])}
GRADS = {'a': jnp.array([0.2, -0.4, 1.0]), 'b': jnp.array([[-3.0]])}
MS = {'a': jnp.array([0.1, 0.2, 0.6]), 'b': jnp.array([[1.1]])}  # mean 0.5


def _flat(tree):
  return np.concatenate([np.ravel(tree['a']), np.ravel(tree['b'])]).astype(np.float64)


def test_sgd_step_by_hand():
  tx = dynamic_sgd(learning_rate=0.1, decay=0.02)
  updates, _ = tx.update(GRADS, tx.init(TRAINED), PARAMS)
  expected = -0.1 * _flat(GRADS) + 0.02 * (_flat(TRAINED) - _flat(PARAMS))
  np.testing.assert_allclose(_flat(updates), expected, rtol=1e-6)
  plain = dynamic_sgd(0.1)
  updates, _ = plain.update(GRADS, plain.init(TRAINED), PARAMS)
  np.testing.assert_allclose(_flat(updates), -0.1 * _flat(GRADS), rtol=1e-6)


@pytest.mark.parametrize('clip', ['lamb', 'krause'])
def test_rms_step_by_hand(clip):
  eta, lam, eps = 0.01, 0.5, 1e-3
  tx = dynamic_rms(eta, lam, eps, MS, decay_clip=clip)
  updates, _ = tx.update(GRADS, tx.init(TRAINED), PARAMS)
  ms = _flat(MS)
  ratio = ms / ms.mean()  # (0.2, 0.4, 1.2, 2.2)
  rate = np.minimum(1.0 if clip == 'lamb' else 1 / lam, ratio)
  expected = (-eta * _flat(GRADS) / (ms + eps)
              + lam * rate * (_flat(TRAINED) - _flat(PARAMS)))
  np.testing.assert_allclose(_flat(updates), expected, rtol=1e-5)
  # The clips differ only where MS / mean(MS) > 1: the last two coordinates.
  assert (rate[2:] != ratio[2:]).all() == (clip == 'lamb')


@pytest.mark.parametrize('make', [lambda: dynamic_sgd(0.1, decay=0.3),
                                  lambda: dynamic_rms(0.1, 0.3, 1e-8, MS)])
def test_decay_with_zero_gradients_returns_to_the_trained_weights(make):
  tx = make()
  state, params = tx.init(TRAINED), PARAMS
  zeros = jax.tree.map(jnp.zeros_like, GRADS)
  for _ in range(400):
    updates, state = tx.update(zeros, state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(_flat(params), _flat(TRAINED), atol=1e-6)


@pytest.fixture(scope='module')
def lm():
  model = RecurrentLM(vocab_size=V, embed_size=5, hidden_sizes=(6,))
  return model, perturb(init_params(model, jax.random.key(0)))


def _python_loop(model, params, tx, stream, segment, **extra_args):
  """Reference: score a segment with the current weights, then step on it
  (a transformation with extra arguments also gets the segment's mean NLL)."""
  state, carries, scores = tx.init(params), model.initialize_carry(1), []
  for start in range(0, len(stream) - 1, segment):
    x = stream[None, start:start + segment]
    y = stream[None, start + 1:start + segment + 1]
    x = x[:, :y.shape[1]]

    def loss(p, carries=carries, x=x, y=y):
      logits, new = model.apply({'params': p}, x, carries)
      total, count = token_nll(logits, y, np.ones(y.shape, np.float32))
      return total / count, (total, new)

    grads, (total, carries) = jax.grad(loss, has_aux=True)(params)
    scores.append(float(total))
    if extra_args:
      extra_args['loss'] = total / y.size
    updates, state = tx.update(grads, state, params, **extra_args)
    params = optax.apply_updates(params, updates)
  return np.array(scores), params


def test_scan_scores_each_segment_before_updating_on_it(lm):
  model, params = lm
  tx = dynamic_sgd(learning_rate=3.0)  # deliberately large: updates change scores a lot
  out = dynamic_evaluate(model, params, tx, STREAM, segment_length=7)
  static = evaluate_stream(make_eval_step(model), params, model.initialize_carry(1),
                           STREAM[:8], 1, 7)
  # The first segment is scored with the trained weights, before any update.
  np.testing.assert_allclose(out.segment_nll[0], static.loss * 7, rtol=1e-5)
  reference, final = _python_loop(model, params, tx, STREAM, 7)
  np.testing.assert_allclose(out.segment_nll, reference, rtol=1e-4)
  np.testing.assert_allclose(_flat_params(out.params), _flat_params(final), rtol=1e-4,
                             atol=1e-5)
  assert out.result.num_tokens == 60 and out.segment_tokens.sum() == 60
  whole = evaluate_stream(make_eval_step(model), params, model.initialize_carry(1),
                          STREAM, 1, 7)
  assert abs(out.result.loss - whole.loss) > 1e-3  # the updates did change the scores


def test_the_scan_drives_a_learned_rule_with_its_meta_parameters_and_the_loss(lm):
  model, params = lm
  eta = 0.7
  ones = lambda features: jnp.ones(features.shape[:-1])
  as_sgd = learned_update_rule(lambda meta, f: (ones(f), -meta * ones(f), 0 * ones(f)))
  out = dynamic_evaluate(model, params, as_sgd, STREAM, 7, extra_args={'meta_params': eta})
  sgd = dynamic_evaluate(model, params, dynamic_sgd(eta), STREAM, 7)
  np.testing.assert_allclose(out.segment_nll, sgd.segment_nll, rtol=1e-5)
  # A step that scales with the loss feature L_t: the segment's mean NLL.
  by_loss = learned_update_rule(lambda meta, f: (ones(f), -meta * f[..., 4], 0 * ones(f)))
  out = dynamic_evaluate(model, params, by_loss, STREAM, 7, extra_args={'meta_params': 0.1})
  reference, _ = _python_loop(model, params, by_loss, STREAM, 7, meta_params=0.1)
  np.testing.assert_allclose(out.segment_nll, reference, rtol=1e-4)
  assert abs(out.result.loss - sgd.result.loss) > 1e-3


def _flat_params(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


def test_zero_learning_rate_is_static_evaluation(lm):
  model, params = lm
  out = dynamic_evaluate(model, params, dynamic_sgd(0.0), STREAM, segment_length=9,
                         batch_size=2)
  static = evaluate_stream(make_eval_step(model), params, model.initialize_carry(2),
                           STREAM, 2, 9)
  np.testing.assert_allclose(out.result.loss, static.loss, rtol=1e-5)


def test_divergence_is_an_error_not_a_number(lm):
  model, params = lm
  with pytest.raises(TrainingError, match='dynamic evaluation diverged'):
    dynamic_evaluate(model, params, dynamic_sgd(1e4), STREAM, segment_length=5)
  with pytest.raises(TrainingError, match='above 1.000'):  # an exploding, finite loss
    dynamic_evaluate(model, params, dynamic_sgd(0.0), STREAM, 5, max_loss=1.0)


def test_rms_training_gradients_by_hand(lm):
  model, params = lm
  ms = rms_training_gradients(model, params, STREAM, batch_size=2, bptt=10, num_batches=2)
  carries, squares = model.initialize_carry(2), []
  inputs = STREAM[:60].reshape(2, 30)
  targets = STREAM[1:61].reshape(2, 30)
  for start in (0, 10):
    x, y = inputs[:, start:start + 10], targets[:, start:start + 10]

    def loss(p, carries=carries, x=x, y=y):
      logits, new = model.apply({'params': p}, x, carries)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new

    grads, carries = jax.grad(loss, has_aux=True)(params)
    squares.append(_flat_params(grads) ** 2)
  np.testing.assert_allclose(_flat_params(ms), np.sqrt(np.mean(squares, 0)), rtol=1e-4,
                             atol=1e-7)


def test_a_non_finite_update_is_skipped_inside_the_scan(lm, caplog):
  model, params = lm
  # An infinite rate makes every update non-finite (inf * g, and inf * 0 = NaN):
  # all are skipped, so the weights stay trained and the scores are static.
  out = dynamic_evaluate(model, params, dynamic_sgd(float('inf')), STREAM, segment_length=9,
                         batch_size=2)
  static = evaluate_stream(make_eval_step(model), params, model.initialize_carry(2),
                           STREAM, 2, 9)
  np.testing.assert_allclose(out.result.loss, static.loss, rtol=1e-5)
  assert out.skipped_updates == len(out.segment_nll)
  np.testing.assert_array_equal(_flat_params(out.params), _flat_params(params))
  assert f'{out.skipped_updates} of {out.skipped_updates} updates were not finite' in caplog.text
  assert dynamic_evaluate(model, params, dynamic_sgd(0.1), STREAM, 9).skipped_updates == 0


def test_an_evaluator_scores_new_settings_as_fresh_transformations_do_without_compiling(
    tiny_config, tmp_path):
  from lm_zoo.optim.dynamic_evaluation import _scan_segments
  from lm_zoo.training import train_and_evaluate
  from lm_zoo.training.dynamic_evaluation import DynamicEvalSettings, DynamicEvaluator
  tiny_config.train.update(num_epochs=1)
  train_and_evaluate(tiny_config, tmp_path)
  evaluator = DynamicEvaluator(tmp_path, 'rms', ms_batches=2, ms_batch_size=2)
  compiled = _scan_segments._cache_size()
  for lr, decay, eps, clip in ((1e-3, 1e-2, 1e-3, 'krause'), (3e-2, 1e-1, 1e-2, 'krause'),
                               (1e-2, 1e-2, 1e-3, 'lamb')):
    shared = evaluator.run(DynamicEvalSettings('rms', lr, decay, eps, 4, clip), 'valid')
    fresh = dynamic_evaluate(evaluator.model, evaluator.params,
                             dynamic_rms(lr, decay, eps, evaluator.rms, clip),
                             evaluator.corpus.valid, 4)
    np.testing.assert_allclose(shared.segment_nll, fresh.segment_nll, rtol=1e-5)
  # One compile per decay clip for the shared transformations, one per fresh one.
  assert _scan_segments._cache_size() - compiled == 2 + 3


def test_a_saved_rms_prior_meta_learner_loads_as_the_rms_rule_it_started_as(
    tiny_config, tmp_path):
  from lm_zoo.training import train_and_evaluate
  from lm_zoo.optim.learned_update import PRECISION_FLOOR
  from lm_zoo.training.dynamic_evaluation import load_meta_learner, meta_train_workdir
  tiny_config.train.update(num_epochs=1)
  train_and_evaluate(tiny_config, tmp_path)
  meta_train_workdir(tmp_path, meta_steps=0, prior='rms', initial_learning_rate=1e-2,
                     initial_decay=0.05, initial_eps=1e-3, fisher_batches=2,
                     fisher_batch_size=2, hidden=4)
  learned, extra = load_meta_learner(tmp_path)
  precision = learned.transformation.init(None).precision  # the model's Fisher, saved
  params = jax.tree.map(lambda x: jnp.linspace(-1.0, 1.0, x.size).reshape(x.shape), precision)
  trained = jax.tree.map(lambda p: p + 0.01, params)
  grads = jax.tree.map(lambda p: jnp.cos(3.0 * p), params)
  updates, _ = learned.transformation.update(grads, learned.transformation.init(trained),
                                             params, loss=4.0, **extra)
  # The rule's ms: weights no gradient reached have a floor, not 0.
  ms = jax.tree.map(lambda x: jnp.sqrt(x + PRECISION_FLOOR), precision)
  rms = dynamic_rms(1e-2, 0.05, 1e-3, ms)
  expected, _ = rms.update(grads, rms.init(trained), params)
  np.testing.assert_allclose(_flat_params(updates), _flat_params(expected), rtol=1e-4,
                             atol=1e-6)
