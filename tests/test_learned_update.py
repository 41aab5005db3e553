"""The meta-learned update rule (eq. 3) against SGD, its gate network against
NumPy, and the Fisher precision against squared gradients."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import check_reverse_gradient

from lm_zoo.cells import LSTMCell
from lm_zoo.evaluation import (
  diagonal_fisher,
  meta_loss,
  meta_train,
  rms_training_gradients,
  stream_windows,
)
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.optim import (
  GateNetwork,
  RMSGateNetwork,
  coordinate_features,
  decay_logits,
  dynamic_rms,
  learned_update_rule,
  mean_rms,
)

PARAMS = {'w': jnp.array([[0.5, -1.0], [2.0, 0.1]]), 'b': jnp.array([0.3, -0.2])}
THETA0 = {'w': jnp.array([[0.4, -0.9], [1.5, 0.0]]), 'b': jnp.array([0.0, 0.1])}
GRADS = {'w': jnp.array([[1.0, -2.0], [0.5, 0.25]]), 'b': jnp.array([-0.7, 0.2])}
PRECISION = {'w': jnp.array([[1.0, 2.0], [0.5, 4.0]]), 'b': jnp.array([3.0, 0.1])}


def _flat(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)]).astype(np.float64)


def test_gates_one_minus_eta_zero_are_sgd():
  eta = 0.05
  fixed = lambda meta, features: (
    jnp.ones(features.shape[:-1]),
    -meta * jnp.ones(features.shape[:-1]),
    jnp.zeros(features.shape[:-1]),
  )
  rule = learned_update_rule(fixed)
  updates, _ = rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=eta, loss=2.0)
  sgd = optax.sgd(eta)
  expected, _ = sgd.update(GRADS, sgd.init(PARAMS))
  np.testing.assert_allclose(_flat(updates), _flat(expected), rtol=1e-6)
  # Inside optax.chain the meta-parameters travel as an extra argument.
  chained = optax.chain(optax.clip_by_global_norm(1.0), rule)
  updates, _ = chained.update(GRADS, chained.init(THETA0), PARAMS, meta_params=eta, loss=2.0)
  clipped = _flat(GRADS) / np.linalg.norm(_flat(GRADS))
  np.testing.assert_allclose(_flat(updates), -eta * clipped, rtol=1e-5)


def test_rule_with_the_gate_network_against_numpy():
  net = GateNetwork(hidden=4)
  meta = net.init(jax.random.key(0), jnp.zeros((1, 5)))
  rng = np.random.default_rng(0)
  meta = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 0.5, jnp.float32), meta)
  rule = learned_update_rule(net.apply, precision=PRECISION)
  loss = 3.2
  updates, _ = rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=meta, loss=loss)

  p = jax.tree.map(lambda x: np.asarray(x, np.float64), meta['params'])
  expected = []
  for name in ('b', 'w'):  # the tree's leaf order
    theta, g, t0, prec = (
      np.ravel(np.asarray(t[name], np.float64)) for t in (PARAMS, GRADS, THETA0, PRECISION)
    )
    features = np.stack([theta - t0, g, t0, np.log(prec + 1e-12), np.full_like(theta, loss)], -1)
    h = np.tanh(features @ p['hidden'] + p['hidden_bias'])
    out = h @ p['gates'] + p['gates_bias']
    f, i, z = 1 / (1 + np.exp(-out[:, 0])), out[:, 1], 1 / (1 + np.exp(-out[:, 2]))
    expected.append(f * theta + i * g + z * t0 - theta)  # eq. (3) minus theta
  np.testing.assert_allclose(_flat(updates), np.concatenate(expected), rtol=1e-4, atol=1e-6)


def test_fresh_gate_network_starts_as_sgd_with_a_slight_pull_to_theta0():
  net = GateNetwork(learning_rate=0.01)
  meta = net.init(jax.random.key(0), jnp.zeros((1, 5)))
  rule = learned_update_rule(net.apply)
  updates, _ = rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=meta, loss=1.0)
  f, z = 1 / (1 + np.exp(-5.0)), 1 / (1 + np.exp(5.0))
  expected = (f - 1) * _flat(PARAMS) - 0.01 * _flat(GRADS) + z * _flat(THETA0)
  np.testing.assert_allclose(_flat(updates), expected, rtol=1e-5, atol=1e-7)
  assert coordinate_features(PARAMS['w'], GRADS['w'], THETA0['w'], PRECISION['w'], 1.0).shape == (
    2,
    2,
    5,
  )


@pytest.mark.parametrize('decay', [1e-4, 1e-3, 0.3])
def test_decay_logits_start_the_rule_as_sgd_with_that_decay_to_theta0(decay):
  net = GateNetwork(learning_rate=0.02, **decay_logits(decay))
  meta = net.init(jax.random.key(0), jnp.zeros((1, 5)))
  rule = learned_update_rule(net.apply)
  updates, _ = rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=meta, loss=1.0)
  # theta' = theta - 0.02 g + decay (theta_0 - theta)
  expected = -0.02 * _flat(GRADS) + decay * (_flat(THETA0) - _flat(PARAMS))
  np.testing.assert_allclose(_flat(updates), expected, rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match='in \\(0, 1\\)'):
    decay_logits(0.0)


# ms = sqrt(PRECISION) / mean: about (0.26, 1.45, 1.11, 0.84, 0.59, 1.67) over
# coordinates; at decay 0.9 the largest reaches the clip at 1.
@pytest.mark.parametrize('decay', [0.05, 0.9])
@pytest.mark.parametrize('decay_mean', ['coordinates', 'tensors'])
def test_fresh_rms_gate_network_is_rms_dynamic_evaluation(decay, decay_mean):
  eta, eps = 0.01, 1e-2
  net = RMSGateNetwork(
    learning_rate=eta, decay=decay, eps=eps, mean_ms=mean_rms(PRECISION, decay_mean)
  )
  meta = net.init(jax.random.key(0), jnp.zeros((1, 5)))
  rule = learned_update_rule(net.apply, precision=PRECISION)
  updates, _ = rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=meta, loss=4.0)
  rms = dynamic_rms(eta, decay, eps, jax.tree.map(jnp.sqrt, PRECISION), decay_mean)
  expected, _ = rms.update(GRADS, rms.init(THETA0), PARAMS)
  np.testing.assert_allclose(_flat(updates), _flat(expected), rtol=1e-5, atol=1e-7)
  ms = np.sqrt(_flat(PRECISION))
  assert mean_rms(PRECISION) == pytest.approx(ms.mean())
  b, w = np.sqrt(np.asarray(PRECISION['b'])), np.sqrt(np.asarray(PRECISION['w']))
  assert mean_rms(PRECISION, 'tensors') == pytest.approx((b.mean() + w.mean()) / 2)
  with pytest.raises(ValueError, match='decay'):
    RMSGateNetwork(learning_rate=eta, decay=0.0, eps=eps, mean_ms=1.0).init(
      jax.random.key(0), jnp.zeros((1, 5))
    )


def test_rms_gate_network_against_numpy():
  # At decay 0.9 and mean_ms 1.2 the rate is clipped at 1 where ms > 1.33.
  eta, decay, eps, mean_ms = 0.02, 0.9, 1e-3, 1.2
  net = RMSGateNetwork(learning_rate=eta, decay=decay, eps=eps, mean_ms=mean_ms, hidden=4)
  meta = net.init(jax.random.key(0), jnp.zeros((1, 5)))
  rng = np.random.default_rng(1)
  meta = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 0.5, jnp.float32), meta)
  rule = learned_update_rule(net.apply, precision=PRECISION)
  loss = 3.2
  updates, _ = rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=meta, loss=loss)

  p = jax.tree.map(lambda x: np.asarray(x, np.float64), meta['params'])
  slog = lambda x: np.sign(x) * np.log1p(np.abs(x))
  expected = []
  for name in ('b', 'w'):  # the tree's leaf order
    theta, g, t0, prec = (
      np.ravel(np.asarray(t[name], np.float64)) for t in (PARAMS, GRADS, THETA0, PRECISION)
    )
    ms = np.sqrt(prec)
    step = eta / (ms + eps)
    rate = np.minimum(1, decay * ms / mean_ms)
    features = np.stack(
      [
        slog(g / (ms + eps)),
        slog((theta - t0) / step),
        slog(t0 / step),
        np.log(ms / mean_ms),
        slog(np.full_like(theta, loss)),
      ],
      -1,
    )
    out = np.tanh(features @ p['hidden'] + p['hidden_bias']) @ p['gates'] + p['gates_bias']
    f = 1 - np.minimum(1, rate * np.exp(out[:, 0]))
    i = -step * np.exp(out[:, 1])
    z = np.minimum(1, rate * np.exp(out[:, 2]))
    expected.append(f * theta + i * g + z * t0 - theta)  # eq. (3) minus theta
  np.testing.assert_allclose(_flat(updates), np.concatenate(expected), rtol=1e-4, atol=1e-6)


def test_fisher_is_the_squared_rms_gradient():
  model = RecurrentLM(Embedding(9, 4), Stack([LSTMCell(5)]), Softmax(9))
  params = init_params(model, jax.random.key(0))
  stream = np.random.default_rng(1).integers(0, 9, 41).astype(np.int32)
  fisher = diagonal_fisher(model, params, stream, 2, 5, 3)
  rms = rms_training_gradients(model, params, stream, 2, 5, 3)
  np.testing.assert_allclose(_flat(fisher), _flat(rms) ** 2, rtol=1e-6)


def _tiny_meta_problem(dtype):
  model = RecurrentLM(Embedding(7, 3), Stack([LSTMCell(4)]), Softmax(7))
  params = jax.tree.map(lambda x: np.asarray(x, dtype), init_params(model, jax.random.key(0)))
  stream = np.random.default_rng(2).integers(0, 7, 13)
  segments = (
    stream[:12].reshape(4, 1, 3),
    stream[1:13].reshape(4, 1, 3),
    np.ones((4, 1, 3), dtype),
  )
  net = GateNetwork(hidden=3, learning_rate=0.5)
  meta = net.init(jax.random.key(1), jnp.zeros((1, 5)))
  rng = np.random.default_rng(3)
  meta = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 0.3, dtype), meta)
  state = learned_update_rule(net.apply).init(params)
  carries = jax.tree.map(lambda x: np.asarray(x, dtype), model.initialize_carry(1))
  return model, net, meta, params, state, carries, segments


def test_meta_gradients_match_finite_differences():
  with jax.enable_x64(True):
    model, net, meta, params, state, carries, segments = _tiny_meta_problem(jnp.float64)
    # Jitted: run eagerly, each call would compile its scan again.
    objective = jax.jit(
      lambda m: meta_loss(model, net.apply, m, params, state, carries, segments)[0]
    )
    [grads] = check_reverse_gradient(objective, (meta,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert _flat(grads['params']).any()  # phi reaches the loss through the updates


def test_meta_loss_scores_before_updating():
  model, net, meta, params, state, carries, segments = _tiny_meta_problem(jnp.float32)
  loss = jax.jit(partial(meta_loss, model, net.apply), static_argnames='checkpoint')
  total, (theta, _, losses) = loss(meta, params, state, carries, segments)
  logits, _ = jax.jit(model.apply)({'params': params}, segments[0][0], carries)
  first = optax.softmax_cross_entropy_with_integer_labels(logits, segments[1][0]).mean()
  np.testing.assert_allclose(losses[0], first, rtol=1e-5)  # theta_0 scores segment 1
  np.testing.assert_allclose(total, losses.sum(), rtol=1e-6)
  assert not np.allclose(_flat(theta), _flat(params))
  unchecked = loss(meta, params, state, carries, segments, checkpoint=False)[0]
  np.testing.assert_allclose(unchecked, total, rtol=1e-6)


def test_checkpointed_meta_training_stores_only_the_weights_per_update():
  """Compiled memory of the meta-gradient: with jax.checkpoint each extra
  unrolled update costs about one copy of the carried weights (what reverse
  mode through a scan must keep), not the update's activations."""
  model = RecurrentLM(Embedding(200, 16), Stack([LSTMCell(32)]), Softmax(200))
  params = init_params(model, jax.random.key(0))
  net = GateNetwork(hidden=2)  # the memory does not depend on it; compile time does
  meta = net.init(jax.random.key(1), jnp.zeros((1, 5)))
  state = learned_update_rule(net.apply).init(params)
  carries = model.initialize_carry(4)
  carried_bytes = 4 * sum(x.size for x in jax.tree.leaves((params, carries)))

  def temp_bytes(steps, checkpoint):
    segments = (
      jnp.zeros((steps, 4, 40), jnp.int32),
      jnp.zeros((steps, 4, 40), jnp.int32),
      jnp.ones((steps, 4, 40)),
    )
    grad = jax.jit(
      jax.grad(
        lambda m: meta_loss(
          model, net.apply, m, params, state, carries, segments, checkpoint=checkpoint
        )[0]
      )
    )
    return grad.lower(meta).compile().memory_analysis().temp_size_in_bytes

  checkpointed = temp_bytes(32, True)
  assert (checkpointed - temp_bytes(8, True)) / 24 < 1.5 * carried_bytes
  assert temp_bytes(32, False) > 10 * checkpointed  # activations of every update


def test_stream_windows_read_consecutive_segments_from_each_offset():
  stream = np.arange(100)
  offsets = np.array([0, 37, 57])
  inputs, targets, weights = stream_windows(stream, offsets, num_updates=6, segment_length=7)
  assert inputs.shape == targets.shape == weights.shape == (6, 3, 7)
  for b, offset in enumerate(offsets):
    np.testing.assert_array_equal(inputs[:, b].ravel(), stream[offset : offset + 42])
    np.testing.assert_array_equal(targets[:, b].ravel(), stream[offset + 1 : offset + 43])
  with pytest.raises(ValueError, match='do not fit'):
    stream_windows(stream, np.array([58]), num_updates=6, segment_length=7)


@pytest.fixture(scope='module')
def meta_problem():
  """`_tiny_meta_problem` in float32 (less its carries and segments) and the
  jitted value and meta-gradient of `meta_loss` on it, compiled once for the
  tests that restate meta-training by hand."""
  model, net, meta, params, state, _, _ = _tiny_meta_problem(jnp.float32)
  value_and_grad = jax.jit(jax.value_and_grad(partial(meta_loss, model, net.apply), has_aux=True))
  return model, net, meta, params, state, value_and_grad


def test_meta_train_steps_adam_along_the_meta_gradient(meta_problem):
  model, net, meta, params, state, value_and_grad = meta_problem
  stream = np.random.default_rng(4).integers(0, 7, 60)
  adam = optax.adam(0.01)
  out = meta_train(
    model,
    net.apply,
    meta,
    params,
    None,
    stream,
    meta_steps=1,
    num_updates=4,
    segment_length=3,
    batch_size=2,
    optimizer=adam,
    seed=5,
  )
  # The same draw of stream positions, the meta-gradient and one Adam step by hand.
  offsets = np.random.default_rng(5).integers(0, len(stream) - 12, 2)
  segments = stream_windows(stream, offsets, 4, 3)
  (loss, _), grads = value_and_grad(meta, params, state, model.initialize_carry(2), segments)
  updates, _ = adam.update(grads, adam.init(meta), meta)
  np.testing.assert_allclose(
    _flat(out.meta_params), _flat(optax.apply_updates(meta, updates)), rtol=1e-5, atol=1e-7
  )
  np.testing.assert_allclose(out.losses, [loss / 4], rtol=1e-5)


def test_meta_training_lowers_the_meta_loss_on_a_repeating_stream():
  """An untrained LM on a stream with period 5 gains from adapting fast: the
  rule must learn larger steps than its small initial one."""
  model = RecurrentLM(Embedding(5, 4), Stack([LSTMCell(8)]), Softmax(5))
  params = init_params(model, jax.random.key(0))
  net = GateNetwork(hidden=4, learning_rate=0.01)
  meta = net.init(jax.random.key(1), jnp.zeros((1, 5)))
  stream = np.tile(np.array([3, 1, 4, 0, 2]), 40)
  state = learned_update_rule(net.apply).init(params)
  segments = stream_windows(stream, np.array([0, 3]), 10, 5)
  held_out = jax.jit(
    lambda m: meta_loss(model, net.apply, m, params, state, model.initialize_carry(2), segments)[0]
  )
  # At Adam's 0.05 this run ended at 0.79 of the initial meta-loss, and changes
  # at float rounding level sent it to 0.98: meta-training that fast is chaotic.
  # At 0.02 it ends at 0.65.
  out = meta_train(
    model,
    net.apply,
    meta,
    params,
    None,
    stream,
    meta_steps=40,
    num_updates=10,
    segment_length=5,
    batch_size=2,
    optimizer=optax.adam(0.02),
    seed=0,
  )
  assert held_out(out.meta_params) < 0.8 * held_out(meta)
  assert out.losses[-5:].mean() < out.losses[:5].mean()


def test_carry_over_continues_along_the_stream_from_the_weights_it_left(meta_problem):
  model, net, meta, params, state, value_and_grad = meta_problem
  stream = np.random.default_rng(4).integers(0, 7, 61)
  adam = optax.adam(0.01)
  # Rows of 30 tokens hold two windows of 4 x 3 = 12: the third meta-step starts over.
  out = meta_train(
    model,
    net.apply,
    meta,
    params,
    None,
    stream,
    meta_steps=3,
    num_updates=4,
    segment_length=3,
    batch_size=2,
    optimizer=adam,
    carry_over=True,
  )
  m, opt_state, theta, carries, losses = meta, adam.init(meta), params, None, []
  for offsets in ([0, 30], [12, 42], [0, 30]):
    if offsets[0] == 0:
      theta, carries = params, model.initialize_carry(2)
    segments = stream_windows(stream, np.array(offsets), 4, 3)
    (loss, (theta, carries, _)), grads = value_and_grad(m, theta, state, carries, segments)
    updates, opt_state = adam.update(grads, opt_state, m)
    m = optax.apply_updates(m, updates)
    losses.append(loss / 4)
  np.testing.assert_allclose(_flat(out.meta_params), _flat(m), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(out.losses, losses, rtol=1e-5)
  assert out.losses[2] == pytest.approx(out.losses[0], rel=0.1)  # the same windows again


def test_the_rule_needs_the_loss_it_reads_and_may_be_donated():
  """The loss is one of the rule's features: an update without it is
  refused, not scored as loss 0. The state holds copies, so a jitted step
  may donate the parameters and the state."""
  meta = GateNetwork(hidden=4).init(jax.random.key(0), jnp.zeros((1, 5)))
  rule = learned_update_rule(GateNetwork(hidden=4).apply, PRECISION)
  with pytest.raises(ValueError, match='loss'):
    rule.update(GRADS, rule.init(THETA0), PARAMS, meta_params=meta)

  def step(params, state):
    updates, state = rule.update(GRADS, state, params, meta_params=meta, loss=2.0)
    return optax.apply_updates(params, updates), state

  donated = jax.jit(step, donate_argnums=(0, 1))(jax.tree.map(jnp.copy, THETA0), rule.init(THETA0))
  kept = jax.jit(step)(THETA0, rule.init(THETA0))
  np.testing.assert_allclose(_flat(donated[0]), _flat(kept[0]), rtol=1e-6)
  np.testing.assert_allclose(
    _flat(THETA0), [0.0, 0.1, 0.4, -0.9, 1.5, 0.0], rtol=1e-6
  )  # not donated
