"""The adaptive feed-forward experiments: data, training, the launch script."""

import json

import jax
import numpy as np
import pytest
from conftest import load_experiment, run_script

from lm_zoo.errors import ConfigError
from lm_zoo.tasks import build_feedforward, run_mnist, run_tail_regression, tail_regression_data


def test_tail_regression_data_follows_its_formula():
  x, y = tail_regression_data(jax.random.key(0), 50_000)
  x, y = np.asarray(x), np.asarray(y)[:, 0]
  noise = y - ((2 * x[:, 0]) ** 2 - (3 * x[:, 1]) ** 4)
  assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1) < 0.02
  assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
  # Var((3 x2)^4) = 3^8 (E x^8 - (E x^4)^2) = 6561 (105 - 9): the heavy tail.
  assert 0.8 < y.var() / (6561 * 96 + 32) < 1.2


def test_tail_regression_models_learn():
  config = load_experiment('tail_regression')
  config.update(steps=0, num_test=5_000, num_saved=10)
  untrained = {r['model']: r['test_mse'] for r in run_tail_regression(config)}
  config.steps = 1_000
  rows = {r['model']: r for r in run_tail_regression(config)}
  assert rows['adaptive_2x2']['num_params'] == 37  # SVA 2x2 x2, bias, GLU 2->4, out 3
  assert rows['feedforward_3x10']['num_params'] == 151
  for name, row in rows.items():
    assert row['test_mse'] < 0.9 * untrained[name], name
    assert len(row['y_true']) == len(row['y_pred']) == 10


def test_mnist_models_learn(data_dir):
  config = load_experiment('mnist_adaptive')
  config.update(steps=300, learning_rate=0.1, data_dir=str(data_dir))
  config.models = {k: config.models[k] for k in ('logistic_regression', 'sva_1')}
  rows = run_mnist(config)
  for row in rows:
    assert row['test_accuracy'] > 0.8 and row['train_accuracy'] > 0.8, row


def test_unknown_policy_net_is_named():
  spec = load_experiment('mnist_adaptive').models.sva_1
  spec.policy_net = 'attention'
  with pytest.raises(ConfigError, match="unknown policy_net 'attention'"):
    build_feedforward(spec)


def test_run_task_script(tmp_path):
  out = tmp_path / 'rows.json'
  done = run_script(
    [
      'launch/run_task.py',
      '--config=experiments/tail_regression.py',
      '--config.steps=50',
      f'--output={out}',
    ]
  )
  assert done.returncode == 0, done.stderr
  assert 'test_mse' in done.stdout and 'y_true' not in done.stdout
  assert {r['model'] for r in json.loads(out.read_text())} == {'adaptive_2x2', 'feedforward_3x10'}
  bad = run_script(['launch/run_task.py', '--config=experiments/default.py', f'--output={out}'])
  assert bad.returncode != 0 and 'config.task is None' in bad.stderr
  assert 'Traceback' not in bad.stderr
