"""Dynamic evaluation: each transformation against a hand-written step, decay
toward the trained weights, score-before-update in the scan, and the guards."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import perturb

from lm_zoo.cells import LSTMCell
from lm_zoo.errors import TrainingError
from lm_zoo.evaluation import (
  dynamic_evaluate,
  evaluate_stream,
  make_eval_step,
  rms_training_gradients,
)
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.models.objective import token_nll
from lm_zoo.optim import dynamic_rms, dynamic_sgd, learned_update_rule, mean_ms

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


def _lamb_update(grads, variables, saves, mss, learning_rate, decay_rate, epsilon):
  """lamb's `dyneval.py` `_make_update`, restated over lists of NumPy arrays."""
  gsum, count = 0.0, 0
  for ms in mss:
    gsum += np.sum(ms)
    count += ms.size
  gsum = gsum / count
  deltas = []
  for grad, var, save, ms in zip(grads, variables, saves, mss):
    rate = np.minimum(1.0, decay_rate * (ms / gsum))
    deltas.append(-learning_rate * grad / (ms + epsilon) + rate * (save - var))
  return deltas


def _krause_update(grads, variables, saves, mss, lr, lamb, epsilon):
  """Krause's `dynamiceval.py` (gradstat's decrate, evaluate's clip at 1/lamb
  and update), restated over lists of NumPy arrays."""
  gsum, count = 0.0, 0
  for ms in mss:
    gsum += np.mean(ms)
    count += 1
  gsum /= count
  deltas = []
  for grad, var, data0, ms in zip(grads, variables, saves, mss):
    decrate = ms / gsum
    decrate[decrate > 1 / lamb] = 1 / lamb
    deltas.append(lamb * decrate * (data0 - var) - lr * grad / (ms + epsilon))
  return deltas


def _leaves(tree):
  return [np.array(x, np.float64) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize(
  'decay_mean, reference', [('coordinates', _lamb_update), ('tensors', _krause_update)]
)
def test_rms_step_is_the_authors_update(decay_mean, reference):
  # MS's mean is 0.5 over the 4 coordinates and 0.7 over the 2 tensors; at
  # lambda 0.8 the largest MS's rate reaches the clip at 1 under both.
  eta, lam, eps = 0.01, 0.8, 1e-3
  tx = dynamic_rms(eta, lam, eps, MS, decay_mean=decay_mean)
  updates, _ = tx.update(GRADS, tx.init(TRAINED), PARAMS)
  expected = reference(
    _leaves(GRADS), _leaves(PARAMS), _leaves(TRAINED), _leaves(MS), eta, lam, eps
  )
  np.testing.assert_allclose(
    _flat(updates), np.concatenate([np.ravel(x) for x in expected]), rtol=1e-5
  )


def test_rms_decay_rates_clip_the_product_with_lambda():
  # lamb clips lambda * MS / mean(MS) at 1: (0.16, 0.32, 0.96, 1.76 -> 1). The
  # form lm_zoo had before, lambda * min(1, MS / mean(MS)), gives 0.8 for the
  # last two coordinates.
  lam = 0.8
  tx = dynamic_rms(1.0, lam, 1e-3, MS)  # zero gradients: eps plays no part
  zeros = jax.tree.map(jnp.zeros_like, GRADS)
  away = jax.tree.map(lambda p: p + 1.0, TRAINED)
  updates, _ = tx.update(zeros, tx.init(TRAINED), away)  # the decay step is -rate
  np.testing.assert_allclose(-_flat(updates), [0.16, 0.32, 0.96, 1.0], rtol=1e-6)
  assert float(mean_ms(MS, 'coordinates')) == pytest.approx(0.5)
  assert float(mean_ms(MS, 'tensors')) == pytest.approx(0.7)
  with pytest.raises(ValueError, match='coordinates'):
    dynamic_rms(1.0, lam, 1e-3, MS, decay_mean='lamb')


@pytest.mark.parametrize(
  'make', [lambda: dynamic_sgd(0.1, decay=0.3), lambda: dynamic_rms(0.1, 0.3, 1e-8, MS)]
)
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
  model = RecurrentLM(Embedding(V, 5), Stack([LSTMCell(6)]), Softmax(V))
  return model, perturb(init_params(model, jax.random.key(0)))


def _python_loop(model, params, tx, stream, segment, **extra_args):
  """Reference: score a segment with the current weights, then step on it
  (a transformation with extra arguments also gets the segment's mean NLL)."""

  def loss(p, carries, x, y):
    logits, new = model.apply({'params': p}, x, carries)
    total, count = token_nll(logits, y, np.ones(y.shape, np.float32))
    return total / count, (total, new)

  # Jitted: eagerly, each of the model's operations would compile on its own.
  grad = jax.jit(jax.grad(loss, has_aux=True))
  state, carries, scores = tx.init(params), model.initialize_carry(1), []
  for start in range(0, len(stream) - 1, segment):
    x = stream[None, start : start + segment]
    y = stream[None, start + 1 : start + segment + 1]
    x = x[:, : y.shape[1]]
    grads, (total, carries) = grad(params, carries, x, y)
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
  static = evaluate_stream(
    make_eval_step(model), params, model.initialize_carry(1), STREAM[:8], 1, 7
  )
  # The first segment is scored with the trained weights, before any update.
  np.testing.assert_allclose(out.segment_nll[0], static.loss * 7, rtol=1e-5)
  reference, final = _python_loop(model, params, tx, STREAM, 7)
  np.testing.assert_allclose(out.segment_nll, reference, rtol=1e-4)
  np.testing.assert_allclose(_flat_params(out.params), _flat_params(final), rtol=1e-4, atol=1e-5)
  assert out.result.num_tokens == 60 and out.segment_tokens.sum() == 60
  whole = evaluate_stream(make_eval_step(model), params, model.initialize_carry(1), STREAM, 1, 7)
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
  out = dynamic_evaluate(model, params, dynamic_sgd(0.0), STREAM, segment_length=9, batch_size=2)
  static = evaluate_stream(make_eval_step(model), params, model.initialize_carry(2), STREAM, 2, 9)
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

  def loss(p, carries, x, y):
    logits, new = model.apply({'params': p}, x, carries)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new

  grad = jax.jit(jax.grad(loss, has_aux=True))  # one compile, not one per operation
  carries, squares = model.initialize_carry(2), []
  inputs = STREAM[:60].reshape(2, 30)
  targets = STREAM[1:61].reshape(2, 30)
  for start in (0, 10):
    x, y = inputs[:, start : start + 10], targets[:, start : start + 10]
    grads, carries = grad(params, carries, x, y)
    squares.append(_flat_params(grads) ** 2)
  np.testing.assert_allclose(_flat_params(ms), np.sqrt(np.mean(squares, 0)), rtol=1e-4, atol=1e-7)


def _nan_on_update(bad: int, learning_rate: float = 0.1) -> optax.GradientTransformation:
  """SGD whose update number `bad` (0-based) is NaN, and so is every later
  one: a skipped update keeps the rule's state, its count included."""

  def update(grads, count, params=None):
    scale = jnp.where(count == bad, jnp.nan, -learning_rate)
    return jax.tree.map(lambda g: scale * g, grads), count + 1

  return optax.GradientTransformation(lambda params: jnp.zeros([], jnp.int32), update)


def test_a_non_finite_update_is_skipped_inside_the_scan(lm, caplog):
  model, params = lm
  skipping = dynamic_evaluate(
    model, params, _nan_on_update(1), STREAM, segment_length=9, batch_size=2
  )
  updates = len(skipping.segment_nll)
  assert skipping.skipped_updates == updates - 1
  assert f'{updates - 1} of {updates} updates were not finite' in caplog.text
  assert np.all(np.isfinite(_flat_params(skipping.params)))
  assert dynamic_evaluate(model, params, dynamic_sgd(0.1), STREAM, 9).skipped_updates == 0


def test_a_dynamic_evaluation_whose_every_update_was_skipped_is_an_error(lm):
  """It would report the static score as its result."""
  model, params = lm
  with pytest.raises(TrainingError, match='every one of the'):
    dynamic_evaluate(
      model, params, optax.scale(float('inf')), STREAM, segment_length=9, batch_size=2
    )
  with pytest.raises(ValueError, match='learning_rate must be a number >= 0, got inf'):
    dynamic_sgd(float('inf'))


def test_token_ids_outside_the_vocabulary_are_refused(lm):
  model, params = lm
  with pytest.raises(ValueError, match=f'token ids must be in \\[0, {V}\\)'):
    dynamic_evaluate(model, params, dynamic_sgd(0.1), np.array([1, 2, V, 3]), 2)


def test_rules_that_are_the_same_program_share_one_compiled_scan(lm):
  """Two sets of weights, each with its own MS: their RMS rules' updates are
  one program (MS is in the state), so the scan compiles once, and each
  score equals the one its own compilation gives. Rules that hold their
  settings as arrays are other programs and compile their own."""
  from lm_zoo.evaluation.dynamic import _scan_segments

  model, params = lm
  weights = (params, perturb(params, seed=3, scale=0.05))
  ms = [jax.tree.map(lambda p, s=s: jnp.full(p.shape, s), params) for s in (0.3, 2.0)]
  rules = [dynamic_rms(0.05, 0.02, 1e-3, m) for m in ms]
  _scan_segments.clear_cache()
  shared = [dynamic_evaluate(model, w, rule, STREAM, 7) for w, rule in zip(weights, rules)]
  assert _scan_segments._cache_size() == 1
  _scan_segments.clear_cache()
  alone = dynamic_evaluate(model, weights[1], rules[1], STREAM, 7)
  np.testing.assert_array_equal(shared[1].segment_nll, alone.segment_nll)
  assert abs(shared[1].result.loss - shared[0].result.loss) > 1e-3  # not the first's score

  _scan_segments.clear_cache()
  held = [
    dynamic_evaluate(model, params, dynamic_sgd(jnp.float32(lr)), STREAM, 7) for lr in (0.5, 2.0)
  ]
  assert _scan_segments._cache_size() == 2
  assert abs(held[0].result.loss - held[1].result.loss) > 1e-3


@pytest.mark.parametrize(
  'make',
  [lambda: dynamic_sgd(0.1, decay=0.02), lambda: dynamic_rms(0.1, 0.02, 1e-3, MS)],
  ids=['sgd', 'rms'],
)
def test_a_jitted_step_may_donate_its_parameters_and_state(make):
  """The state holds copies of theta_g and MS: a step that donates the
  parameters and the state (as a train step does) takes the same steps as
  one that does not, and leaves the caller's trained weights and MS whole."""
  tx = make()

  def step(params, state):
    updates, state = tx.update(GRADS, state, params)
    return optax.apply_updates(params, updates), state

  kept = jax.jit(step)
  donated = jax.jit(step, donate_argnums=(0, 1))
  params, state = jax.tree.map(jnp.copy, TRAINED), tx.init(TRAINED)
  expected, expected_state = TRAINED, tx.init(TRAINED)
  for _ in range(2):
    params, state = donated(params, state)
    expected, expected_state = kept(expected, expected_state)
  np.testing.assert_allclose(_flat(params), _flat(expected), rtol=1e-6)
  assert _flat(TRAINED).tolist() == [1.0, -2.0, 0.5, 3.0]  # neither donated nor moved
  assert float(MS['b'][0, 0]) == np.float32(1.1)
