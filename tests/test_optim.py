"""Every transformation of lm_zoo.optim behaves as optax's own do: its state
is a NamedTuple, and the same update comes out of it called directly, under
jit, inside `optax.chain` (which hands extra arguments on) and from an
`optax.inject_hyperparams` copy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm_zoo.optim import (
  GateNetwork,
  RMSGateNetwork,
  dynamic_rms,
  dynamic_sgd,
  learned_update_rule,
  parameter_averaging,
  start_averaging,
)

PARAMS = {'w': jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), 'b': jnp.array([0.5, -0.25])}
TRAINED = jax.tree.map(lambda p: p + 0.1, PARAMS)
GRADS = jax.tree.map(lambda p: jnp.cos(2.0 * p), PARAMS)
MS = jax.tree.map(lambda p: 0.1 + jnp.abs(p), PARAMS)
FEATURES = np.zeros((1, 5), np.float32)
GATES = GateNetwork(hidden=3, learning_rate=0.1)
RMS_GATES = RMSGateNetwork(learning_rate=0.1, decay=0.2, eps=1e-3, mean_ms=0.6, hidden=3)


def _transformations():
  """name -> (transformation, extra arguments of its update)."""
  meta = GATES.init(jax.random.key(0), FEATURES)
  rms_meta = RMS_GATES.init(jax.random.key(1), FEATURES)
  return {
    'dynamic_sgd': (dynamic_sgd(0.1, 0.05), {}),
    'dynamic_rms': (dynamic_rms(0.1, 0.2, 1e-3, MS), {}),
    'dynamic_rms_tensors': (dynamic_rms(0.1, 0.2, 1e-3, MS, 'tensors'), {}),
    'learned_sgd_prior': (learned_update_rule(GATES.apply), {'meta_params': meta, 'loss': 3.0}),
    'learned_rms_prior': (
      learned_update_rule(RMS_GATES.apply, MS),
      {'meta_params': rms_meta, 'loss': 3.0},
    ),
    'parameter_averaging': (parameter_averaging(start=True), {}),
  }


@pytest.mark.parametrize('name', list(_transformations()))
def test_direct_jitted_and_chained_updates_agree(name):
  transformation, extra = _transformations()[name]
  state = transformation.init(TRAINED)
  # A NamedTuple state, or a chain's tuple of them (optax's own pieces included).
  parts = [state] if hasattr(state, '_fields') else list(state)
  assert all(isinstance(part, tuple) and hasattr(part, '_fields') for part in parts)
  direct, _ = (
    transformation.update(GRADS, state, PARAMS, **extra)
    if extra
    else transformation.update(GRADS, state, PARAMS)
  )
  jitted, _ = jax.jit(lambda g, s, p, e: transformation.update(g, s, p, **e))(
    GRADS, state, PARAMS, extra
  )
  chain = optax.chain(optax.identity(), transformation)
  chained, _ = chain.update(GRADS, chain.init(TRAINED), PARAMS, **extra)
  for other in (jitted, chained):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), direct, other)
  assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(direct))


@pytest.mark.parametrize('name', [*_transformations(), 'dynamic_rms_injected'])
def test_a_jitted_update_closes_over_no_array(name):
  """What a transformation was built with (MS, the decay's scale) reaches a
  jitted update through the state: as constants, a large model's MS would be
  compiled into every program that updates, once per set of weights."""
  if name == 'dynamic_rms_injected':
    transformation, extra = (
      optax.inject_hyperparams(
        lambda learning_rate, decay, eps: dynamic_rms(learning_rate, decay, eps, MS)
      )(learning_rate=0.1, decay=0.2, eps=1e-3),
      {},
    )
  else:
    transformation, extra = _transformations()[name]
  traced = jax.make_jaxpr(lambda g, s, p, e: transformation.update(g, s, p, **e))(
    GRADS, transformation.init(TRAINED), PARAMS, extra
  )
  assert traced.consts == []


@pytest.mark.parametrize(
  'factory, values',
  [
    (dynamic_sgd, {'learning_rate': 0.1, 'decay': 0.05}),
    (
      lambda learning_rate, decay, eps: dynamic_rms(learning_rate, decay, eps, MS),
      {'learning_rate': 0.1, 'decay': 0.2, 'eps': 1e-3},
    ),
  ],
)
def test_injected_hyperparameters_give_the_same_update(factory, values):
  plain = factory(**values)
  injected = optax.inject_hyperparams(factory)(**values)
  expected, _ = plain.update(GRADS, plain.init(TRAINED), PARAMS)
  updates, state = injected.update(GRADS, injected.init(TRAINED), PARAMS)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), expected, updates)
  assert set(state.hyperparams) == set(values)


@pytest.mark.parametrize(
  'transformation',
  [dynamic_sgd(0.1), dynamic_rms(0.1, 0.2, 1e-3, MS), learned_update_rule(GATES.apply)],
)
def test_updates_without_params_are_refused_with_a_message(transformation):
  with pytest.raises(ValueError, match='params'):
    transformation.update(GRADS, transformation.init(TRAINED))


@pytest.mark.parametrize(
  'factory', [dynamic_sgd, lambda learning_rate: dynamic_rms(learning_rate, 0.0, 1e-3, MS)]
)
def test_a_learning_rate_schedule_is_called_with_the_updates_taken(factory):
  """As optax takes a number or a schedule: update k steps at schedule(k)."""
  schedule = optax.linear_schedule(0.3, 0.1, transition_steps=2)
  scheduled = factory(schedule)
  state = scheduled.init(TRAINED)
  params = PARAMS
  for k in range(4):
    fixed = factory(float(schedule(k)))
    expected, _ = fixed.update(GRADS, fixed.init(TRAINED), params)
    updates, state = jax.jit(scheduled.update)(GRADS, state, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, expected)
    params = optax.apply_updates(params, updates)
  counts = [s.count for s in state if isinstance(s, optax.ScaleByScheduleState)]
  assert [int(c) for c in counts] == [4]  # optax's schedule counts the updates


def test_averaging_is_switched_on_inside_a_chain():
  chain = optax.chain(optax.sgd(0.5), parameter_averaging())
  state = start_averaging(chain.init(PARAMS))
  updates, state = chain.update(GRADS, state, PARAMS)
  new = optax.apply_updates(PARAMS, updates)
  jax.tree.map(np.testing.assert_allclose, state[1].average, new)
