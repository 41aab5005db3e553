"""Optimizers from the config and the epoch learning-rate schedules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.training import epoch_learning_rate, make_optimizer, set_learning_rate


def _schedule(**kw):
  cfg = base_config().schedule
  cfg.update(kw)
  return cfg


def test_zaremba_small_schedule():
  cfg = _schedule(kind='exponential', factor=0.5, decay_after=4)
  lrs = [epoch_learning_rate(cfg, 1.0, e, []) for e in range(1, 14)]
  assert lrs == [1, 1, 1, 1] + [0.5**k for k in range(1, 10)]


def test_milestones_and_plateau():
  cfg = _schedule(kind='milestones', factor=0.1, milestones=(100, 160))
  assert [epoch_learning_rate(cfg, 3e-3, e, []) for e in (100, 101, 160, 161)] == pytest.approx(
    [3e-3, 3e-4, 3e-4, 3e-5]
  )
  cfg = _schedule(kind='plateau', factor=0.5, min_lr=0.2)
  history = [5.0, 4.0, 4.5, 3.9, 3.95, 3.95]
  assert epoch_learning_rate(cfg, 1.0, 7, history[:2]) == 1.0
  assert epoch_learning_rate(cfg, 1.0, 7, history[:3]) == 0.5
  assert epoch_learning_rate(cfg, 1.0, 7, history) == pytest.approx(0.2)  # floor
  with pytest.raises(ConfigError, match="schedule.kind='cosine' is not known"):
    epoch_learning_rate(_schedule(kind='cosine'), 1.0, 1, [])


def test_sgd_with_clipping_and_l2_matches_hand_computation():
  cfg = base_config().optimizer
  cfg.update(name='sgd', learning_rate=0.1, clip_norm=1.0, l2=0.01)
  tx = make_optimizer(cfg)
  params = {'w': jnp.array([1.0, -2.0])}
  grads = {'w': jnp.array([3.0, 4.0])}  # norm 5 -> clipped to norm 1
  state = tx.init(params)
  updates, state = tx.update(grads, state, params)
  expected = -0.1 * (np.array([0.6, 0.8]) + 0.01 * np.array([1.0, -2.0]))
  np.testing.assert_allclose(updates['w'], expected, rtol=1e-6)
  state = set_learning_rate(state, 0.05)
  updates, _ = tx.update(grads, state, params)
  np.testing.assert_allclose(updates['w'], expected / 2, rtol=1e-6)


def test_l2_before_clip_clips_the_penalty_with_the_loss():
  """lamb's L2 is part of the objective: the clipped gradient is g + l2 theta."""
  cfg = base_config().optimizer
  cfg.update(name='sgd', learning_rate=0.1, clip_norm=1.0, l2=0.5, l2_before_clip=True)
  tx = make_optimizer(cfg)
  params = {'w': jnp.array([2.0, -2.0])}
  grads = {'w': jnp.array([2.0, 5.0])}  # + 0.5 theta = (3, 4): norm 5 -> (0.6, 0.8)
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates['w'], -0.1 * np.array([0.6, 0.8]), rtol=1e-6)
  cfg.l2_before_clip = False  # clipped (2, 5) / sqrt(29), then + 0.5 theta
  updates, _ = make_optimizer(cfg).update(grads, tx.init(params), params)
  np.testing.assert_allclose(
    updates['w'], -0.1 * (np.array([2.0, 5.0]) / np.sqrt(29) + [1.0, -1.0]), rtol=1e-6
  )


def test_adam_beta1_zero_is_rmsprop_like():
  cfg = base_config().optimizer
  cfg.update(name='adam', learning_rate=1e-3, beta1=0.0, beta2=0.999, clip_norm=0.0)
  tx = make_optimizer(cfg)
  params = {'w': jnp.zeros(3)}
  g1, g2 = np.array([0.5, -1.0, 2.0]), np.array([-1.0, 3.0, 2.0])
  state = tx.init(params)
  _, state = tx.update({'w': jnp.asarray(g1)}, state, params)
  updates, _ = tx.update({'w': jnp.asarray(g2)}, state, params)
  # beta1 = 0: the step is the current gradient over the RMS of all gradients
  v = (0.001 * 0.999 * g1**2 + 0.001 * g2**2) / (1 - 0.999**2)
  np.testing.assert_allclose(updates['w'], -1e-3 * g2 / (np.sqrt(v) + 1e-8), rtol=1e-4)


def test_unknown_optimizer():
  cfg = base_config().optimizer
  cfg.name = 'lion'
  with pytest.raises(ConfigError, match="optimizer.name='lion' is not known"):
    make_optimizer(cfg)


def test_dual_l2_acts_on_the_dual_layer_only():
  cfg = base_config().optimizer
  cfg.update(name='sgd', learning_rate=1.0, clip_norm=0.0, l2=0.0, dual_l2=0.1)
  tx = make_optimizer(cfg)
  params = {
    'bridge': {'dense': {'kernel': jnp.array([2.0, -1.0])}},
    'stack': {'cell_0': {'kernel': jnp.array([3.0])}},
  }
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates['bridge']['dense']['kernel'], [-0.2, 0.1])
  np.testing.assert_allclose(updates['stack']['cell_0']['kernel'], [0.0])


def test_nadam_first_step_has_the_nesterov_lookahead():
  """Dozat's Nadam: the first step is lr * (1 + b1 / (1 + b1)) * g / |g|,
  where Adam's is lr * g / |g|."""
  cfg = base_config().optimizer
  cfg.update(name='nadam', learning_rate=1e-2, beta1=0.9, beta2=0.999, eps=0.0, clip_norm=0.0)
  tx = make_optimizer(cfg)
  params = {'w': jnp.zeros(3)}
  grads = {'w': jnp.array([0.5, -2.0, 4.0])}
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates['w'], -1e-2 * (1 + 0.9 / 1.9) * np.sign(grads['w']), rtol=1e-5)
