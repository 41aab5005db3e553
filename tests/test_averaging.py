"""Parameter averaging (averaged SGD) and the triggers that start it."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.optim import (
  averaged_params,
  averaging_state,
  is_averaging,
  parameter_averaging,
  start_averaging,
)
from lm_zoo.runs import read_metrics
from lm_zoo.training import train_and_evaluate
from lm_zoo.training.averaging import patience_reached, should_start_averaging


def _descend(tx, params, steps):
  """`steps` updates on sum(p²); returns the final state and every iterate."""
  grad = jax.grad(lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p)))
  state, iterates = tx.init(params), []
  for _ in range(steps):
    updates, state = tx.update(grad(params), state, params)
    params = optax.apply_updates(params, updates)
    iterates.append(jax.tree.map(np.asarray, params))
  return state, iterates


PARAMS = {'w': jnp.array([1.0, -2.0, 3.0]), 'b': jnp.array(0.5)}


def test_average_of_the_iterates_since_the_start():
  state, iterates = _descend(
    optax.chain(optax.sgd(0.1), parameter_averaging(start=True)), PARAMS, 6
  )
  for name in PARAMS:
    np.testing.assert_allclose(
      averaged_params(state)[name], np.mean([it[name] for it in iterates], axis=0), rtol=1e-6
    )


def test_updates_pass_through_and_averaging_waits_for_its_start():
  tx = optax.chain(optax.sgd(0.1), parameter_averaging())
  state, iterates = _descend(tx, PARAMS, 3)
  _, plain = _descend(optax.sgd(0.1), PARAMS, 3)
  np.testing.assert_allclose(iterates[-1]['w'], plain[-1]['w'])
  assert not is_averaging(state) and averaged_params(state) is None
  state = start_averaging(state)
  params = jax.tree.map(jnp.asarray, iterates[-1])
  grad = jax.grad(lambda p: jnp.sum(p['w'] ** 2) + p['b'] ** 2)
  after = []
  for _ in range(4):
    updates, state = tx.update(grad(params), state, params)
    params = optax.apply_updates(params, updates)
    after.append(np.asarray(params['w']))
  # Only the iterates after the switch count.
  np.testing.assert_allclose(averaged_params(state)['w'], np.mean(after, axis=0), rtol=1e-6)


def test_the_python_side_readers_refuse_a_traced_or_stacked_state_naming_the_flag():
  """is_averaging and averaged_params give one run's answer as Python
  values: under jit, or for a stack of seeds (one seed switched on), they
  refuse in one line naming averaging_state's per-seed flag, which holds
  the answer there."""
  tx = optax.chain(optax.sgd(0.1), parameter_averaging())
  message = r'^is_averaging and averaged_params read one run.s state .* averaging_state'
  with pytest.raises(ValueError, match=message):
    jax.jit(averaged_params)(start_averaging(tx.init(PARAMS)))
  stacked = jax.vmap(tx.init)(jax.tree.map(lambda a: jnp.stack([a, a]), PARAMS))
  stacked = start_averaging(stacked, index=1)
  with pytest.raises(ValueError, match=message):
    is_averaging(stacked)
  np.testing.assert_array_equal(averaging_state(stacked).averaging, [False, True])


def test_start_needs_an_average_in_the_state():
  with pytest.raises(ValueError, match='averaging.trigger'):
    start_averaging(optax.sgd(0.1).init(PARAMS))


def _averaging(trigger, **kw):
  return ml_collections.ConfigDict({'trigger': trigger, 'nonmono': 2, 'start_fraction': 0.5, **kw})


def test_nonmonotone_trigger_is_awd_lstms():
  cfg = _averaging('nonmonotone')
  # More than nonmono = 2 earlier losses, and worse than the best before the last 2.
  assert not should_start_averaging(cfg, 5.0, [4.0, 3.0], 3, 10)
  assert not should_start_averaging(cfg, 3.5, [4.0, 3.0, 3.2], 4, 10)  # 3.5 < min([4.0])
  assert should_start_averaging(cfg, 4.1, [4.0, 3.0, 3.2], 4, 10)
  assert not should_start_averaging(cfg, 2.95, [4.0, 3.0, 3.2, 3.3], 5, 10)
  assert should_start_averaging(cfg, 3.1, [4.0, 3.0, 3.2, 3.3], 5, 10)
  assert should_start_averaging(cfg, 3.1, [4.0, 3.0, 3.2, 3.3, 3.4], 6, 10)


def test_plateau_fraction_and_unknown_triggers():
  assert should_start_averaging(_averaging('plateau'), 3.0, [4.0, 3.0], 3, 10)
  assert not should_start_averaging(_averaging('plateau'), 2.9, [4.0, 3.0], 3, 10)
  assert not should_start_averaging(_averaging('fraction'), 1.0, [], 4, 10)
  assert should_start_averaging(_averaging('fraction'), 1.0, [], 5, 10)
  for trigger in ('none', 'always'):
    assert not should_start_averaging(_averaging(trigger), 9.0, [1.0] * 9, 10, 10)
  with pytest.raises(ConfigError, match="averaging.trigger='asgd' is not known"):
    should_start_averaging(_averaging('asgd'), 1.0, [], 1, 1)


def test_patience_trigger_is_lambs():
  """trigger_averaging_turns and trigger_averaging_at_the_latest in updates:
  so many updates since the best validation, or a given update."""
  cfg = _averaging('patience', patience_steps=400, latest_step=1600)
  assert not patience_reached(cfg, step=1000, best_step=601)
  assert patience_reached(cfg, step=1000, best_step=600)
  assert patience_reached(cfg, step=1600, best_step=1590)  # at the latest
  assert not patience_reached(
    _averaging('patience', patience_steps=400, latest_step=0), step=1600, best_step=1590
  )
  assert not patience_reached(_averaging('plateau', patience_steps=1, latest_step=1), 9, 0)
  assert not should_start_averaging(cfg, 9.0, [1.0] * 9, 10, 10)  # decided per turn


def test_patience_starts_averaging_at_a_validation_turn(tiny_config, tmp_path):
  """Validating every 4 updates of 10-update epochs, with a patience longer
  than the run and averaging at update 12 at the latest: the turns after
  update 12 score averaged weights."""
  tiny_config.averaging.update(trigger='patience', patience_steps=1000, latest_step=12)
  tiny_config.train.update(num_epochs=2, eval_every=4)
  train_and_evaluate(tiny_config, tmp_path / 'run')
  valid = [
    (r['step'], r['averaged'])
    for r in read_metrics(tmp_path / 'run' / 'metrics.jsonl')
    if r['kind'] == 'valid' and not r.get('final')
  ]
  assert valid == [(4, False), (8, False), (10, False), (12, False), (16, True), (20, True)]


def test_training_switches_to_averaged_weights_after_the_trigger(tiny_config, tmp_path):
  tiny_config.averaging.update(trigger='fraction', start_fraction=0.5)
  tiny_config.train.num_epochs = 3
  summary = train_and_evaluate(tiny_config, tmp_path / 'run')
  valid = [
    r
    for r in read_metrics(tmp_path / 'run' / 'metrics.jsonl')
    if r['kind'] == 'valid' and not r.get('final')
  ]
  # ceil(0.5 * 3) = 2: epochs 1 and 2 evaluate the weights, epoch 3 their average.
  assert [r['averaged'] for r in valid] == [False, False, True]
  assert np.isfinite(summary['valid']['perplexity'])


def test_unknown_trigger_in_a_config_is_named():
  from lm_zoo.training import make_optimizer

  with pytest.raises(ConfigError, match='averaging.trigger'):
    make_optimizer(base_config().optimizer, 'sometimes')


def test_fine_tuning_starts_from_the_best_weights_of_a_run(tiny_config, tmp_path):
  tiny_config.train.num_epochs = 1
  first = train_and_evaluate(tiny_config, tmp_path / 'first')
  # AWD-LSTM's fine-tuning stage, with a zero learning rate so that the
  # weights (and their average) stay those of the first run's best checkpoint.
  tiny_config.train.init_from = str(tmp_path / 'first')
  tiny_config.averaging.trigger = 'always'
  tiny_config.optimizer.learning_rate = 0.0
  tuned = train_and_evaluate(tiny_config, tmp_path / 'tuned')
  assert tuned['valid']['perplexity'] == pytest.approx(first['valid']['perplexity'], rel=1e-6)
  tiny_config.train.init_from = str(tmp_path / 'nowhere')
  with pytest.raises(ConfigError, match='not a work directory'):
    train_and_evaluate(tiny_config, tmp_path / 'again')
