"""Dynamic evaluation (Krause et al. 2018; docs/models.md §7) as optax
gradient transformations.

Dynamic evaluation adapts the weights to the text being scored: each segment
is scored with the current weights first, then the weights take a gradient
step on that segment. The transformations here map the segment's gradient to
that step; `lm_zoo.evaluation.dynamic_evaluate` runs a whole stream with one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

# What mean(MS) of the RMS decay rate is taken over (`dynamic_rms`).
DECAY_MEANS = ('coordinates', 'tensors')


class DynamicEvalState(NamedTuple):
  """The trained weights theta_g that the update decays toward, the
  per-coordinate scale s of that decay (the decay rate is lambda * s for
  SGD, s = 1, or min(1, lambda * s) for RMS, s = MS / mean(MS)), and the
  number of updates taken (a learning-rate schedule's step)."""
  trained: optax.Params
  decay_scale: optax.Updates
  count: jax.Array


def _check(**values) -> None:
  """Refuses a NaN, infinite or negative setting given as a number (values
  inside `optax.inject_hyperparams`' state are arrays, checked where they
  were chosen; a schedule is checked by what it returns)."""
  for name, value in values.items():
    if isinstance(value, (int, float)) and not (0 <= value < float('inf')):
      raise ValueError(f'{name} must be a number >= 0, got {value}')


def dynamic_sgd(learning_rate: optax.ScalarOrSchedule,
                decay: float = 0.0) -> optax.GradientTransformation:
  """Dynamic evaluation by SGD, optionally decaying toward the trained weights:

    theta <- theta - eta * g + lambda * (theta_g - theta)

  Args:
    learning_rate: eta, or a schedule of it (`optax.linear_schedule`, ...),
      called with the number of updates taken.
    decay: lambda; 0 is plain SGD (Krause et al. 2018, section 5).
  Returns:
    An `optax.GradientTransformation`; `update` needs `params`. Its state
    keeps theta_g, the parameters `init` is called with.
  """
  _check(learning_rate=learning_rate, decay=decay)

  def init_fn(params):
    return DynamicEvalState(trained=params, decay_scale=jax.tree.map(jnp.ones_like, params),
                            count=jnp.zeros([], jnp.int32))

  def update_fn(grads, state, params=None):
    rates = jax.tree.map(lambda s: decay * s, state.decay_scale)
    return _step(grads, state, params, learning_rate, rates)

  return optax.GradientTransformation(init_fn, update_fn)


def mean_ms(rms_gradients: optax.Updates, over: str = 'coordinates') -> jax.Array:
  """mean(MS) of the RMS decay rate: over every coordinate of the model
  ('coordinates', lamb's `dyneval.py`), or over the parameter tensors of each
  tensor's mean ('tensors', Krause's `dynamiceval.py`, where a tensor is a
  leaf of the tree)."""
  if over not in DECAY_MEANS:
    raise ValueError(f'the mean of the decay rate must be over one of {DECAY_MEANS}, '
                     f'got {over!r}')
  leaves = jax.tree.leaves(rms_gradients)
  if over == 'tensors':
    return sum(jnp.mean(x) for x in leaves) / len(leaves)
  return sum(jnp.sum(x) for x in leaves) / sum(x.size for x in leaves)


def dynamic_rms(learning_rate: optax.ScalarOrSchedule, decay: float, eps: float,
                rms_gradients: optax.Updates,
                decay_mean: str = 'coordinates') -> optax.GradientTransformation:
  """Dynamic evaluation with RMS-normalised steps and decay toward the
  trained weights (Krause et al. 2018; docs/models.md §7):

    theta <- theta - eta * g / (MS + eps) + min(1, lambda * MS / mean(MS)) * (theta_g - theta)

  where MS is the root mean square of training gradients (`rms_gradients`,
  from `lm_zoo.evaluation.rms_training_gradients`): each coordinate decays at a rate that grows
  with its MS, clipped at 1 so that no step overshoots theta_g. mean(MS) is
  over every coordinate of the model with 'coordinates' (lamb's
  `dyneval.py`, `_make_update`) and over the parameter tensors of each
  tensor's mean with 'tensors' (Krause's `dynamiceval.py`); `mean_ms`.

  Args:
    learning_rate: eta, or a schedule of it, called with the number of
      updates taken.
    decay: lambda.
    eps: epsilon, added to MS.
    rms_gradients: MS, a tree like the parameters.
    decay_mean: 'coordinates' or 'tensors'.
  Returns:
    An `optax.GradientTransformation`; `update` needs `params`.
  """
  _check(learning_rate=learning_rate, decay=decay, eps=eps)
  if isinstance(eps, (int, float)) and eps == 0:
    raise ValueError('eps must be positive: it keeps g / (MS + eps) finite where MS is 0')
  mean = mean_ms(rms_gradients, decay_mean)

  def init_fn(params):
    return DynamicEvalState(trained=params,
                            decay_scale=jax.tree.map(lambda ms: ms / mean, rms_gradients),
                            count=jnp.zeros([], jnp.int32))

  def update_fn(grads, state, params=None):
    scaled = jax.tree.map(lambda g, ms: g / (ms + eps), grads, rms_gradients)
    rates = jax.tree.map(lambda s: jnp.minimum(1.0, decay * s), state.decay_scale)
    return _step(scaled, state, params, learning_rate, rates)

  return optax.GradientTransformation(init_fn, update_fn)


def _step(direction, state: DynamicEvalState, params, learning_rate, decay_rates):
  """The update -eta g + rate (theta_g - theta), and the state one update on."""
  if params is None:
    raise ValueError('dynamic evaluation decays toward the trained weights: pass '
                     'params to update (update(grads, state, params))')
  eta = learning_rate(state.count) if callable(learning_rate) else learning_rate
  updates = jax.tree.map(lambda d, p, p0, r: -eta * d + r * (p0 - p),
                         direction, params, state.trained, decay_rates)
  return updates, state._replace(count=optax.safe_increment(state.count))
