"""Parameter averaging (averaged SGD) as an optax transformation.

`parameter_averaging()` goes last in an optax chain: it passes the updates
through unchanged and, once switched on with `start_averaging`, keeps the
running mean of the parameters after every update. Evaluation then uses
`averaged_params(opt_state)`; `lm_zoo.training.averaging` holds the triggers
that switch it on.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import tree_utils


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
    return ParameterAveragingState(
      averaging=jnp.asarray(start),
      count=jnp.zeros([], jnp.int32),
      # a copy: the train step donates both buffers
      average=jax.tree.map(jnp.copy, params),
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(optax.NO_PARAMS_MSG)
    new_params = optax.apply_updates(params, updates)
    count = jnp.where(state.averaging, state.count + 1, 0)
    step = 1.0 / jnp.maximum(count, 1).astype(jnp.float32)
    average = jax.tree.map(
      lambda a, p: jnp.where(state.averaging, a + (p - a) * step.astype(a.dtype), p),
      state.average,
      new_params,
    )
    return updates, ParameterAveragingState(state.averaging, count, average)

  return optax.GradientTransformation(init_fn, update_fn)


def _averaging_states(opt_state) -> list[ParameterAveragingState]:
  return [
    s
    for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, ParameterAveragingState))
    if isinstance(s, ParameterAveragingState)
  ]


def is_averaging(opt_state) -> bool:
  """Whether `opt_state`, one run's, holds a parameter average that has
  started: a Python bool, read outside `jax.jit`. Under `jit`, or for a
  state with a leading axis of seeds, read `averaging_state(opt_state).averaging`
  (a flag per seed) instead.

  Raises:
    ValueError: a traced state, or one of several seeds.
  """
  states = _averaging_states(opt_state)
  if not states:
    return False
  flag = states[0].averaging
  if isinstance(flag, jax.core.Tracer) or jnp.ndim(flag):
    raise ValueError(
      "is_averaging and averaged_params read one run's state outside jax.jit: under jit or "
      'for a stack of seeds, read averaging_state(opt_state).averaging (a flag per seed) '
      'and .average'
    )
  return bool(flag)


def start_averaging(opt_state, index: int | None = None):
  """`opt_state` with its `parameter_averaging` switched on; for a state
  with a leading axis of seeds, `index` switches on that seed's alone."""
  states = _averaging_states(opt_state)
  if not states:
    raise ValueError(
      'the optimizer keeps no parameter average: set averaging.trigger to something other than none'
    )
  flag = states[0].averaging
  started = jnp.ones_like(flag) if index is None else jnp.asarray(flag).at[index].set(True)
  return tree_utils.tree_set(opt_state, averaging=started)


def averaging_state(opt_state) -> ParameterAveragingState | None:
  """The state of `opt_state`'s `parameter_averaging`, or None without one."""
  states = _averaging_states(opt_state)
  return states[0] if states else None


def averaged_params(opt_state) -> Any | None:
  """The averaged parameters once averaging has started, else None; one
  run's state, outside `jax.jit` (`is_averaging`)."""
  return _averaging_states(opt_state)[0].average if is_averaging(opt_state) else None
