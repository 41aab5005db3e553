"""Dynamic evaluation (Krause et al. 2018; docs/models.md §7) as optax
gradient transformations.

Dynamic evaluation adapts the weights to the text being scored: each segment
is scored with the current weights first, then the weights take a gradient
step on that segment. The transformations here map the segment's gradient to
that step; `lm_zoo.evaluation.dynamic_evaluate` runs a whole stream with one.
"""

from __future__ import annotations

import enum
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


class DecayMean(enum.StrEnum):
  """What mean(MS) of the RMS decay rate is taken over (`mean_ms`)."""

  COORDINATES = 'coordinates'
  TENSORS = 'tensors'


DECAY_MEANS = tuple(mean.value for mean in DecayMean)


class ScaleByFixedRmsState(NamedTuple):
  """MS, the fixed root mean square of gradients the updates are divided by."""

  rms_gradients: optax.Updates


class DecayTowardTrainedState(NamedTuple):
  """The trained weights theta_g the updates decay toward, and the decay's
  per-coordinate scale s (the rate is lambda * s, or min(1, lambda * s))."""

  trained: optax.Params
  decay_scale: optax.Updates


def _check(**values) -> None:
  """Refuses a NaN, infinite or negative setting given as a number (values
  inside `optax.inject_hyperparams`' state are arrays, checked where they
  were chosen; a schedule is checked by what it returns)."""
  for name, value in values.items():
    if isinstance(value, (str, bytes, bool)) or (
      isinstance(value, (int, float)) and not 0 <= value < float('inf')
    ):
      raise ValueError(f'{name} must be a number >= 0, got {value!r}')


def scale_by_fixed_rms(rms_gradients: optax.Updates, eps: float) -> optax.GradientTransformation:
  """g / (MS + eps) for a fixed MS (`rms_gradients`, a tree like the
  parameters): RMSProp's scaling with statistics estimated once, ahead.
  MS is kept in the state, so that a jitted `update` takes it as an
  argument rather than compiling it into its program as constants; a copy,
  so that a step that donates its state leaves the caller's MS whole."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(lambda g, ms: g / (ms + eps), updates, state.rms_gradients), state

  def init_fn(params):
    del params
    return ScaleByFixedRmsState(jax.tree.map(jnp.copy, rms_gradients))

  return optax.GradientTransformation(init_fn, update_fn)


def decay_toward_trained(
  decay: float,
  decay_scale: optax.Updates | Callable[[optax.Params], optax.Updates] | None = None,
  clip: bool = False,
) -> optax.GradientTransformation:
  """Adds rate * (theta_g - theta) to the updates, theta_g the parameters
  `init` is called with (the trained weights) and rate = decay * s, or
  min(1, decay * s) with `clip`, s the per-coordinate `decay_scale` (ones
  when None), or what it returns when called with the parameters at `init`
  (as `optax.masked` takes a mask). The scale and theta_g live in the state,
  copies of the arrays given, so that a jitted step may donate the
  parameters and the state (`donate_argnums`), as with optax's own.

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`.
  """

  def init_fn(params):
    if decay_scale is None:
      scale = jax.tree.map(jnp.ones_like, params)
    else:
      scale = jax.tree.map(jnp.copy, decay_scale(params) if callable(decay_scale) else decay_scale)
    return DecayTowardTrainedState(trained=jax.tree.map(jnp.copy, params), decay_scale=scale)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        'dynamic evaluation decays toward the trained weights: pass '
        'params to update (update(grads, state, params))'
      )

    def decayed(u, p, p0, s):
      rate = jnp.minimum(1.0, decay * s) if clip else decay * s
      return u + rate * (p0 - p)

    return jax.tree.map(decayed, updates, params, state.trained, state.decay_scale), state

  return optax.GradientTransformation(init_fn, update_fn)


def dynamic_sgd(
  learning_rate: optax.ScalarOrSchedule, decay: float = 0.0
) -> optax.GradientTransformation:
  """Dynamic evaluation by SGD, optionally decaying toward the trained weights:

    theta <- theta - eta * g + lambda * (theta_g - theta)

  `optax.chain(optax.scale_by_learning_rate(eta), decay_toward_trained(lambda))`.

  Args:
    learning_rate: eta, or a schedule of it (`optax.linear_schedule`, ...),
      called with the number of updates taken.
    decay: lambda; 0 is plain SGD (Krause et al. 2018, section 5).
  Returns:
    An `optax.GradientTransformation`; `update` needs `params`. Its state
    keeps theta_g, the parameters `init` is called with.
  """
  _check(learning_rate=learning_rate, decay=decay)
  return optax.chain(optax.scale_by_learning_rate(learning_rate), decay_toward_trained(decay))


def _check_decay_mean(over: str) -> None:
  if over not in DECAY_MEANS:
    raise ValueError(f'the mean of the decay rate must be over one of {DECAY_MEANS}, got {over!r}')


def mean_ms(rms_gradients: optax.Updates, over: str = 'coordinates') -> jax.Array:
  """mean(MS) of the RMS decay rate: over every coordinate of the model
  ('coordinates', lamb's `dyneval.py`), or over the parameter tensors of each
  tensor's mean ('tensors', Krause's `dynamiceval.py`, where a tensor is a
  leaf of the tree)."""
  _check_decay_mean(over)
  leaves = jax.tree.leaves(rms_gradients)
  if over == 'tensors':
    return sum(jnp.mean(x) for x in leaves) / len(leaves)
  return sum(jnp.sum(x) for x in leaves) / sum(x.size for x in leaves)


def dynamic_rms(
  learning_rate: optax.ScalarOrSchedule,
  decay: float,
  eps: float,
  rms_gradients: optax.Updates,
  decay_mean: str = 'coordinates',
) -> optax.GradientTransformation:
  """Dynamic evaluation with RMS-normalised steps and decay toward the
  trained weights (Krause et al. 2018; docs/models.md §7):

    theta <- theta - eta * g / (MS + eps) + min(1, lambda * MS / mean(MS)) * (theta_g - theta)

  where MS is the root mean square of training gradients (`rms_gradients`,
  from `lm_zoo.evaluation.rms_training_gradients`): each coordinate decays
  at a rate that grows with its MS, clipped at 1 so that no step overshoots
  theta_g. mean(MS) is over every coordinate of the model with
  'coordinates' (lamb's `dyneval.py`, `_make_update`) and over the
  parameter tensors of each tensor's mean with 'tensors' (Krause's
  `dynamiceval.py`); `mean_ms`. It is the chain of `scale_by_fixed_rms`,
  `optax.scale_by_learning_rate` and `decay_toward_trained`.

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
  _check_decay_mean(decay_mean)

  def relative_ms(params):
    del params
    mean = mean_ms(rms_gradients, decay_mean)
    return jax.tree.map(lambda ms: ms / mean, rms_gradients)

  # MS enters only `init`'s state: inside `optax.inject_hyperparams`, whose
  # `update` builds the chain again, no array of it is computed at update.
  return optax.chain(
    scale_by_fixed_rms(rms_gradients, eps),
    optax.scale_by_learning_rate(learning_rate),
    decay_toward_trained(decay, relative_ms, clip=True),
  )
