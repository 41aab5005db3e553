"""The train.nonfinite policies as `PendingUpdates` applies them to fetched
updates (the loop's side, with real training, is tests/test_faults.py)."""

import math

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lm_zoo.errors import TrainingError
from lm_zoo.runs.nonfinite import PendingUpdates, RollBack
from lm_zoo.training.loop import Progress


class _Records:
  def __init__(self):
    self.records = []

  def write(self, kind, **values):
    self.records.append({'kind': kind, **values})


def _updates(policy, tmp_path, max_consecutive_skips=2, max_rollbacks=1):
  cfg = ml_collections.ConfigDict(
    {
      'nonfinite': policy,
      'max_consecutive_skips': max_consecutive_skips,
      'max_rollbacks': max_rollbacks,
    }
  )
  records = _Records()
  return PendingUpdates(cfg, records, tmp_path), records


def _add(updates, step, loss):
  loss = jnp.float32(loss)
  # a stand-in gradient norm that tells the updates apart
  updates.add(
    step, {'loss': loss, 'grad_norm': jnp.float32(10 * step), 'finite': jnp.isfinite(loss)}
  )


@pytest.mark.parametrize('policy', ['stop', 'skip', 'rollback'])
def test_finite_losses_come_back_in_order_and_once(policy, tmp_path):
  updates, records = _updates(policy, tmp_path)
  for step, loss in enumerate([2.5, 1.25, 0.5], start=1):
    _add(updates, step, loss)
  fetched = updates.fetch(Progress())
  # an update a row, a seed a column
  np.testing.assert_array_equal(fetched.losses, [[2.5], [1.25], [0.5]])
  np.testing.assert_array_equal(fetched.grad_norms, [[10], [20], [30]])
  assert updates.fetch(Progress()).losses.size == 0
  assert records.records == []


def test_stop_names_the_step_and_records_it(tmp_path):
  updates, records = _updates('stop', tmp_path)
  _add(updates, 1, 1.0)
  _add(updates, 2, math.nan)
  with pytest.raises(TrainingError, match='not finite at or before step 2 .epoch 3.'):
    updates.fetch(Progress(epoch=3))
  assert records.records == [{'kind': 'nonfinite', 'step': 2, 'epoch': 3, 'action': 'stop'}]


def test_skip_counts_and_stops_after_too_many_in_a_row(tmp_path):
  updates, records = _updates('skip', tmp_path, max_consecutive_skips=2)
  progress = Progress()
  for step, loss in enumerate([math.inf, 1.0, math.nan, math.nan], start=1):
    _add(updates, step, loss)
  # A finite update between two faults resets the run of skips.
  np.testing.assert_array_equal(
    updates.fetch(progress).losses, [[np.nan], [1.0], [np.nan], [np.nan]]
  )
  assert progress.skipped_updates == [3]
  assert [r['step'] for r in records.records] == [1, 3, 4]
  _add(updates, 5, math.nan)  # the third in a row
  with pytest.raises(TrainingError, match='3 updates in a row up to step 5'):
    updates.fetch(progress)


def test_rollback_asks_the_loop_then_stops_past_the_limit(tmp_path):
  updates, records = _updates('rollback', tmp_path, max_rollbacks=1)
  _add(updates, 1, 1.0)
  _add(updates, 2, math.nan)
  _add(updates, 3, 1.0)
  fetched = updates.fetch(Progress())
  assert fetched.rollback == RollBack(step=2, seeds=(0,))
  np.testing.assert_array_equal(fetched.losses, [[1.0]])  # of the updates before it
  assert records.records == []  # the loop records the rollback once it has restored
  _add(updates, 4, math.nan)
  with pytest.raises(TrainingError, match='at step 4 after 1 rollbacks'):
    updates.fetch(Progress(rollbacks=[1]))
  assert records.records[-1]['action'] == 'stop'


def _seeds_updates(policy, tmp_path):
  cfg = ml_collections.ConfigDict(
    {'nonfinite': policy, 'max_consecutive_skips': 1, 'max_rollbacks': 1}
  )
  records = _Records()
  return PendingUpdates(cfg, records, tmp_path, seeds=[7, 8, 9]), records


def _add_seeds(updates, step, losses):
  losses = jnp.asarray(losses, jnp.float32)
  updates.add(step, {'loss': losses, 'grad_norm': 2 * losses, 'finite': jnp.isfinite(losses)})


def test_each_seed_skips_its_own_updates(tmp_path):
  updates, records = _seeds_updates('skip', tmp_path)
  progress = Progress.start(3)
  _add_seeds(updates, 1, [1.0, math.nan, 3.0])
  _add_seeds(updates, 2, [math.inf, 2.0, 3.0])
  fetched = updates.fetch(progress)
  np.testing.assert_array_equal(fetched.losses, [[1.0, np.nan, 3.0], [np.nan, 2.0, 3.0]])
  assert progress.skipped_updates == [1, 1, 0]
  assert [(r['step'], r['seed']) for r in records.records] == [(1, 8), (2, 7)]
  # the runs of skips are counted seed by seed: seed 9's second in a row stops it
  _add_seeds(updates, 3, [1.0, 1.0, math.nan])
  _add_seeds(updates, 4, [1.0, 1.0, math.nan])
  with pytest.raises(TrainingError, match=r'^seed 9: 2 updates in a row up to step 4'):
    updates.fetch(progress)


def test_a_seed_rollback_names_the_faulty_seeds_and_a_stop_names_the_seed(tmp_path):
  updates, _ = _seeds_updates('rollback', tmp_path)
  _add_seeds(updates, 1, [1.0, 1.0, 1.0])
  _add_seeds(updates, 2, [math.nan, 1.0, math.nan])
  fetched = updates.fetch(Progress.start(3))
  assert fetched.rollback == RollBack(step=2, seeds=(0, 2))
  np.testing.assert_array_equal(fetched.losses, [[1.0, 1.0, 1.0]])
  stopping, records = _seeds_updates('stop', tmp_path)
  _add_seeds(stopping, 5, [1.0, math.nan, 1.0])
  with pytest.raises(
    TrainingError,
    match=r'^seed 8: the training loss or gradient is not '
    r'finite at or before step 5',
  ):
    stopping.fetch(Progress.start(3))
  assert records.records == [
    {'kind': 'nonfinite', 'step': 5, 'epoch': 1, 'seed': 8, 'action': 'stop'}
  ]
