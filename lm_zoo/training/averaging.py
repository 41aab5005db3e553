"""Parameter averaging (averaged SGD) as an optax transformation, and the
triggers that switch it on: AWD-LSTM's non-monotone trigger (NT-ASGD,
Merity et al. 2018), a validation plateau, a fraction of training, or lamb's
patience (so many steps without a new best, or a given step at the latest).

`parameter_averaging()` goes last in an optax chain: it passes the updates
through unchanged and, once switched on with `start_averaging`, keeps the
running mean of the parameters after every update. Evaluation then uses
`averaged_params(opt_state)`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import optax
from optax import tree_utils

from lm_zoo.errors import ConfigError

TRIGGERS = ('none', 'always', 'nonmonotone', 'plateau', 'fraction', 'patience')


class ParameterAveragingState(NamedTuple):
  """State of `parameter_averaging`.

  Attributes:
    averaging: whether the running mean is being kept (bool scalar).
    count: number of parameter vectors in the mean since it started.
    average: the running mean; the current parameters while not averaging.
  """

  averaging: jax.Array
  count: jax.Array
  average: optax.Params


def parameter_averaging(start: bool = False) -> optax.GradientTransformation:
  """Averaged SGD's iterate averaging (Polyak & Juditsky 1992), as AWD-LSTM
  uses it after its trigger: a_k = a_{k-1} + (θ_k - a_{k-1}) / k over the
  parameters θ_k after each update since averaging started.

  Args:
    start: average from the first update (a fine-tuning stage) instead of
      waiting for `start_averaging`.

  Returns:
    A `GradientTransformation` that leaves the updates unchanged; it needs
    `params` in `update` and must come last in a chain, so that params +
    updates are the parameters after the step.
  """

  def init_fn(params):
    return ParameterAveragingState(averaging=jnp.asarray(start),
                                   count=jnp.zeros([], jnp.int32),
                                   # a copy: the train step donates both buffers
                                   average=jax.tree.map(jnp.copy, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(optax.NO_PARAMS_MSG)
    new_params = optax.apply_updates(params, updates)
    count = jnp.where(state.averaging, state.count + 1, 0)
    step = 1.0 / jnp.maximum(count, 1).astype(jnp.float32)
    average = jax.tree.map(
        lambda a, p: jnp.where(state.averaging, a + (p - a) * step.astype(a.dtype), p),
        state.average, new_params)
    return updates, ParameterAveragingState(state.averaging, count, average)

  return optax.GradientTransformation(init_fn, update_fn)


def _averaging_states(opt_state) -> list[ParameterAveragingState]:
  return [s for s in jax.tree.leaves(
      opt_state, is_leaf=lambda s: isinstance(s, ParameterAveragingState))
      if isinstance(s, ParameterAveragingState)]


def is_averaging(opt_state) -> bool:
  """Whether `opt_state` holds a parameter average that has started."""
  states = _averaging_states(opt_state)
  return bool(states) and bool(states[0].averaging)


def start_averaging(opt_state):
  """`opt_state` with its `parameter_averaging` switched on."""
  if not _averaging_states(opt_state):
    raise ConfigError('the optimizer keeps no parameter average: set '
                      'averaging.trigger to something other than none')
  return tree_utils.tree_set(opt_state, averaging=jnp.asarray(True))


def averaged_params(opt_state) -> Any | None:
  """The averaged parameters once averaging has started, else None."""
  return _averaging_states(opt_state)[0].average if is_averaging(opt_state) else None


def should_start_averaging(cfg: ml_collections.ConfigDict, valid_loss: float,
                           past_valid_losses: Sequence[float], epoch: int,
                           num_epochs: int) -> bool:
  """Whether to switch averaging on after `epoch` (1-based), from
  `config.averaging`, given this epoch's validation loss and the earlier ones.

  triggers:
    none, always: never switch here (always averages from the first step).
    nonmonotone: AWD-LSTM's NT-ASGD, the loss is worse than the best before
      the last `nonmono` epochs (and there are more than `nonmono`).
    plateau: the loss does not improve on the best so far.
    fraction: `epoch` has reached `start_fraction` of `num_epochs`.
    patience: never here; it is decided at every validation turn
      (`patience_reached`).
  """
  if cfg.trigger not in TRIGGERS:
    raise ConfigError(f'unknown averaging trigger {cfg.trigger!r} (averaging.trigger): '
                      f'choose one of {", ".join(TRIGGERS)}')
  past = list(past_valid_losses)
  if cfg.trigger == 'nonmonotone':
    return len(past) > cfg.nonmono and valid_loss > min(past[:-cfg.nonmono])
  if cfg.trigger == 'plateau':
    return bool(past) and valid_loss >= min(past)
  if cfg.trigger == 'fraction':
    return epoch >= math.ceil(cfg.start_fraction * num_epochs)
  return False


def patience_reached(cfg: ml_collections.ConfigDict, step: int, best_step: int) -> bool:
  """The 'patience' trigger of `config.averaging`, checked after each
  validation turn: the best validation loss is at least `patience_steps`
  updates old, or training reached `latest_step` (when > 0). lamb's
  trigger_averaging_turns and trigger_averaging_at_the_latest, in turns of
  steps_per_turn updates (`training.py`)."""
  return cfg.trigger == 'patience' and (
      step - best_step >= cfg.patience_steps or 0 < cfg.latest_step <= step)
