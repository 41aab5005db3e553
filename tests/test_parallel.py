"""Data parallelism over a mesh of 8 simulated CPU devices (tests/conftest.py)."""

import logging

import jax
import numpy as np
import pytest
from conftest import tiny_lm_config

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import build_model
from lm_zoo.training import (
  create_train_state,
  data_mesh,
  make_optimizer,
  make_train_step,
  shard_batch,
  state_shardings,
  train_and_evaluate,
)
from lm_zoo.training.parallel import DATA_AXIS, check_batch

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (simulated) devices')


def tiny_setup(batch_size=8):
  config = base_config()
  config.model.update(
    embed_size=12,
    hidden_size=16,
    dropout_input=0.2,
    dropout_hidden=0.2,
    dropout_state=0.1,
    dropout_output=0.2,
  )
  config.data.batch_size = batch_size
  model = build_model(config.model, 50)
  optimizer = make_optimizer(config.optimizer)
  return config, model, optimizer


def batches(batch_size, bptt=7, count=4):
  rng = np.random.default_rng(3)
  for _ in range(count):
    tokens = rng.integers(0, 50, (batch_size, bptt + 1)).astype(np.int32)
    yield tokens[:, :-1], tokens[:, 1:], np.ones((batch_size, bptt), np.float32)


def train(num_devices):
  config, model, optimizer = tiny_setup()
  mesh = data_mesh(num_devices)
  state = create_train_state(model, optimizer, config)
  if mesh is not None:
    state = jax.device_put(state, state_shardings(state, mesh))
  step = make_train_step(model, optimizer, mesh=mesh)
  losses = []
  for batch in batches(config.data.batch_size):
    state, metrics = step(state, *shard_batch(mesh, *batch))
    losses.append(float(metrics['loss']))
  return state, losses


def test_eight_devices_give_the_one_device_losses_and_parameters():
  single, single_losses = train(1)
  sharded, sharded_losses = train(8)
  np.testing.assert_allclose(sharded_losses, single_losses, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  # The work was split: carries stay split by row, parameters replicated.
  carry = jax.tree.leaves(sharded.carries)[0]
  assert carry.sharding.spec[0] == DATA_AXIS and len(carry.sharding.device_set) == 8
  kernel = jax.tree.leaves(sharded.params)[0]
  assert kernel.sharding.is_fully_replicated and len(kernel.sharding.device_set) == 8


def test_mesh_and_batch_checks_name_the_field():
  assert data_mesh(1) is None
  assert data_mesh(0).size == jax.device_count()
  with pytest.raises(ConfigError, match='parallel.num_devices=99'):
    data_mesh(99)
  with pytest.raises(ConfigError, match='data.batch_size=6 does not split over 4 devices'):
    check_batch(6, data_mesh(4))


class _Records(logging.Handler):
  def __init__(self):
    super().__init__()
    self.records = []

  def emit(self, record):
    self.records.append(record)


@pytest.fixture(scope='module')
def runs_by_devices(data_dir, tmp_path_factory):
  """{num_devices: (summary, the train step's compile log lines)} of
  `tiny_config` on 1 and 2 devices over 3 epochs with a rate that falls
  after the first."""
  runs = {}
  jax_log = logging.getLogger('jax')
  for num_devices in (1, 2):
    config = tiny_lm_config(data_dir)
    config.update_from_flattened_dict(
      {
        'parallel.num_devices': num_devices,
        'train.num_epochs': 3,
        'generate.num_lines': 0,
        'schedule.kind': 'exponential',
        'schedule.decay_after': 1,
      }
    )
    handler, level = _Records(), jax_log.level
    jax_log.addHandler(handler)
    jax_log.setLevel(logging.WARNING)
    try:
      with jax.log_compiles(True):
        summary = train_and_evaluate(config, tmp_path_factory.mktemp(f'devices_{num_devices}'))
    finally:
      jax_log.removeHandler(handler)
      jax_log.setLevel(level)
    compiles = [
      r for r in handler.records if r.getMessage().startswith('Compiling jit(train_step)')
    ]
    runs[num_devices] = summary, compiles
  return runs


def test_training_loop_runs_data_parallel_and_matches_one_device(runs_by_devices):
  (one, _), (two, _) = runs_by_devices[1], runs_by_devices[2]
  assert two['valid']['perplexity'] == pytest.approx(one['valid']['perplexity'], rel=1e-4)
  assert two['test']['perplexity'] == pytest.approx(one['test']['perplexity'], rel=1e-4)


@pytest.mark.parametrize('num_devices', [1, 2])
def test_the_train_step_compiles_once_over_epochs_and_learning_rates(num_devices, runs_by_devices):
  """The carries reset at each epoch and each new learning rate are placed as
  the steps leave them: another input layout would compile the step again
  (on a mesh, at every epoch: seconds each on a real model)."""
  _, compiles = runs_by_devices[num_devices]
  assert len(compiles) == 1
