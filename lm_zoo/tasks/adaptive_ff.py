"""The adaptive feed-forward experiments of Flennerhag et al. (2018): extreme
tail regression (section 5.1) and MNIST (section 5.2)."""

from __future__ import annotations

import functools
import logging
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm_zoo.data import load_mnist
from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.layers import FeedForwardPolicy, GLUPolicy, LinearPolicy
from lm_zoo.models.feedforward import FeedForward

log = logging.getLogger(__name__)

POLICY_NETS = {'linear': LinearPolicy, 'feedforward': FeedForwardPolicy, 'glu': GLUPolicy}
ACTIVATIONS = {'relu': nn.relu, 'tanh': jnp.tanh, 'identity': lambda x: x}


def tail_regression_data(key: jax.Array, num: int) -> tuple[jax.Array, jax.Array]:
  """x ~ N(0, I_2), y = (2 x1)^2 - (3 x2)^4 + ε with ε ~ N(0, 1): most of the
  data lies near a plane, the tails grow fast."""
  key_x, key_e = jax.random.split(key)
  x = jax.random.normal(key_x, (num, 2))
  y = (2 * x[:, 0]) ** 2 - (3 * x[:, 1]) ** 4 + jax.random.normal(key_e, (num,))
  return x, y[:, None]


def feedforward_spec(features, adaptive=(), **overrides) -> dict:
  """A model spec for `build_feedforward`, for configs: an MLP of widths
  `features` (ReLU between layers), layer i adaptive when `adaptive[i]`, with
  SVA adaptation and a GLU policy unless `overrides` say otherwise."""
  return {
    'features': tuple(features),
    'adaptive': tuple(adaptive),
    'policy': 'sva',
    'inner_features': 0,
    'policy_net': 'glu',
    'policy_hidden': 0,
    'activation': 'relu',
    **overrides,
  }


def build_feedforward(spec: ml_collections.ConfigDict) -> FeedForward:
  """A `FeedForward` from a model spec: features, adaptive, policy,
  inner_features, policy_net (linear | feedforward | glu), policy_hidden
  (feedforward only), activation (relu | tanh | identity)."""
  for field, table in (('policy_net', POLICY_NETS), ('activation', ACTIVATIONS)):
    if spec[field] not in table:
      raise ConfigError(f'unknown {field} {spec[field]!r}: choose one of {", ".join(table)}')
  policy_net = POLICY_NETS[spec.policy_net]
  if spec.policy_net == 'feedforward':
    policy_net = functools.partial(policy_net, hidden=spec.policy_hidden)
  return FeedForward(
    tuple(spec.features),
    tuple(spec.adaptive),
    spec.policy,
    spec.inner_features,
    policy_net,
    ACTIVATIONS[spec.activation],
  )


def fit(
  model: nn.Module,
  params,
  sample_batch: Callable,
  loss_fn: Callable,
  optimizer: optax.GradientTransformation,
  steps: int,
  seed: int,
  log_every: int = 1000,
  data: tuple = (),
):
  """`steps` optimizer steps on batches `sample_batch(key, *data)` -> (x, y),
  run as jitted `lax.scan`s of `log_every` steps; returns the trained params.
  The arrays batches are drawn from go in `data`: arguments of the compiled
  scan, where a closure would make them constants of its program."""

  def step(carry, key, data):
    params, opt_state = carry
    x, y = sample_batch(key, *data)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(model.apply({'params': p}, x), y))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  run = jax.jit(
    lambda carry, keys, data: jax.lax.scan(lambda carry, key: step(carry, key, data), carry, keys)
  )
  carry = (params, optimizer.init(params))
  keys = jax.random.split(jax.random.key(seed), steps)
  for start in range(0, steps, log_every):
    carry, losses = run(carry, keys[start : start + log_every], data)
    loss = float(losses.mean())
    if not np.isfinite(loss):
      raise TrainingError(
        f'the training loss is not finite by step {start + log_every}: lower the learning rate'
      )
    log.info('step %d  loss %.4f', min(start + log_every, steps), loss)
  return carry[0]


def _num_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def run_tail_regression(config: ml_collections.ConfigDict) -> list[dict]:
  """Test MSE of each model in `config.models` (experiments/tail_regression.py),
  with the first `config.num_saved` test targets and predictions for plots."""
  x_test, y_test = tail_regression_data(jax.random.key(config.test_seed), config.num_test)
  mse = lambda pred, y: jnp.mean((pred - y) ** 2)
  rows = []
  for name, spec in config.models.items():
    model = build_feedforward(spec)
    params = model.init(jax.random.key(config.seed), x_test[:1])['params']
    sample = lambda key: tail_regression_data(key, config.batch_size)
    params = fit(
      model, params, sample, mse, optax.adam(config.learning_rate), config.steps, config.seed
    )
    pred = model.apply({'params': params}, x_test)
    rows.append(
      {
        'model': name,
        'num_params': _num_params(params),
        'test_mse': float(mse(pred, y_test)),
        'y_true': np.asarray(y_test[: config.num_saved, 0]).tolist(),
        'y_pred': np.asarray(pred[: config.num_saved, 0]).tolist(),
      }
    )
  return rows


def run_mnist(config: ml_collections.ConfigDict) -> list[dict]:
  """Train and test accuracy of each model in `config.models`
  (experiments/mnist_adaptive.py), SGD on the softmax cross-entropy."""
  data = load_mnist(config.data_dir or None)
  train = tuple(map(jnp.asarray, data['train']))

  def sample(key, x, y):
    index = jax.random.randint(key, (config.batch_size,), 0, len(y))
    return x[index], y[index]

  def cross_entropy(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  rows = []
  for name, spec in config.models.items():
    model = build_feedforward(spec)
    params = model.init(jax.random.key(config.seed), train[0][:1])['params']
    params = fit(
      model,
      params,
      sample,
      cross_entropy,
      optax.sgd(config.learning_rate),
      config.steps,
      config.seed,
      data=train,
    )
    correct = jax.jit(
      lambda params, x, y, model=model: jnp.sum(
        jnp.argmax(model.apply({'params': params}, x), -1) == y
      )
    )
    row = {'model': name, 'num_params': _num_params(params)}
    for split, (x, y) in data.items():
      right = sum(
        int(correct(params, x[i : i + 10_000], y[i : i + 10_000])) for i in range(0, len(y), 10_000)
      )
      row[f'{split}_accuracy'] = right / len(y)
    log.info('%s: %s', name, row)
    rows.append(row)
  return rows
