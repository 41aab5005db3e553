"""The meta-learned update rule (eq. 3) against SGD, its gate network against
NumPy, and the Fisher precision against squared gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm_zoo.cells import LSTMCell
from lm_zoo.evaluation import (
  diagonal_fisher,
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


def test_fisher_is_the_mean_squared_gradient_of_consecutive_windows():
  model = RecurrentLM(Embedding(9, 4), Stack([LSTMCell(5)]), Softmax(9))
  params = init_params(model, jax.random.key(0))
  stream = np.random.default_rng(1).integers(0, 9, 41).astype(np.int32)
  fisher = diagonal_fisher(model, params, stream, 2, 5, 3)

  def loss(p, carries, x, y):
    logits, new = model.apply({'params': p}, x, carries)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new

  # Two rows of 20 tokens, three windows of 5 along them, the state carried.
  grad = jax.jit(jax.grad(loss, has_aux=True))
  carries, squares = model.initialize_carry(2), []
  inputs, targets = stream[:40].reshape(2, 20), stream[1:41].reshape(2, 20)
  for start in (0, 5, 10):
    grads, carries = grad(
      params, carries, inputs[:, start : start + 5], targets[:, start : start + 5]
    )
    squares.append(_flat(grads) ** 2)
  np.testing.assert_allclose(_flat(fisher), np.mean(squares, 0), rtol=1e-4, atol=1e-9)


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
