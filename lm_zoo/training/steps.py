"""The jitted train step and the state it updates."""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lm_zoo.models.objective import token_nll
from lm_zoo.models.regularisation import (
  activation_penalty,
  drop_carried_state,
  temporal_activation_penalty,
)
from lm_zoo.training.parallel import state_shardings
from lm_zoo.training.seed_axis import stack, take_seed


@flax.struct.dataclass
class TrainState:
  """Everything a train step changes; checkpointed whole.

  Attributes:
    step: number of updates taken.
    params: model parameters.
    opt_state: optimizer state (the learning rate included).
    carries: each layer's recurrent state, carried across BPTT windows.
    rng: base key data; step t's dropout key is fold_in(rng, t), so a resumed
      run draws the same masks.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  carries: Any
  rng: jax.Array


def make_train_step(
  model: nn.Module,
  optimizer: optax.GradientTransformation,
  sum_over_time: bool = False,
  ar: float = 0.0,
  tar: float = 0.0,
  mesh: jax.sharding.Mesh | None = None,
  skip_nonfinite: bool = False,
  drop_state: float = 0.0,
  stacked: bool = False,
  hold_padding: bool = False,
) -> Callable:
  """Returns jitted `train_step(state, inputs, targets, weights) -> (state, metrics)`.

  The objective is the mean NLL per token, or with `sum_over_time` the NLL
  summed over the window's time steps and averaged over the batch (Zaremba et
  al.'s convention, under which their lr 1 and clip 5 were tuned), plus
  AWD-LSTM's AR (`ar` = alpha) and TAR (`tar` = beta) penalties on the last
  layer's outputs that the model sows. The model sees its weights after
  weight drop (`model.dropped_weights`), and with `drop_state` > 0 carries in
  which each batch row's state was zeroed with that probability
  (`drop_carried_state`, lamb's drop_state_probability). The new carries are
  returned with gradients stopped; the state is donated. A window padded past
  its own steps (weight 0 in every row) is scored on them alone; with
  `hold_padding` the model holds its state past them too (`RecurrentLM(steps=)`),
  so the new carries are the unpadded window's (variable BPTT's padded windows).

  With a `mesh` (`lm_zoo.training.parallel.data_mesh`) the step is data
  parallel: it expects the batch and the carries split by row over the mesh's
  data axis (`shard_batch`, `state_shardings`) and keeps them so; parameters
  and optimizer state stay replicated, and XLA all-reduces the gradients.

  The metrics are the mean NLL `loss`, the gradients' global norm `grad_norm`
  and `finite`: whether both are finite, decided on the device so the loop
  reads it with the loss, without a sync of its own. With `skip_nonfinite`
  a step where they are not leaves the parameters, optimizer state and
  carries as they were (the update is dropped) and only counts the step.

  With `stacked` every leaf of the state has a leading axis of seeds
  (`lm_zoo.training.seed_axis`; the loop's state always has it) and the step
  is vmapped over it: each seed takes its own update on the same window, the
  metrics have that axis too, and a mesh splits the carries' second axis. A
  seed axis of one takes the unstacked step, bit for bit.
  """
  objective = functools.partial(
    _objective, model, sum_over_time=sum_over_time, ar=ar, tar=tar, hold_padding=hold_padding
  )

  def train_step(state: TrainState, inputs, targets, weights):
    grads, (loss, new_carries) = _gradients(objective, drop_state, state, inputs, targets, weights)
    new_state = _apply_gradients(optimizer, state, grads, new_carries)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if skip_nonfinite:
      new_state = _update_if_finite(finite, new_state, state)
    if mesh is not None:
      new_state = jax.lax.with_sharding_constraint(new_state, state_shardings(new_state, mesh))
    return new_state, {'loss': loss, 'grad_norm': grad_norm, 'finite': finite}

  return jax.jit(on_seed_axis(train_step) if stacked else train_step, donate_argnums=0)


def _gradients(objective: Callable, drop_state: float, state: TrainState, inputs, targets, weights):
  """The gradient of `objective` (`_objective` with its options bound) at the
  state's parameters, and its (mean NLL, new carries): with the step's keys
  (fold_in(rng, step): a resumed run draws the same masks) and the carries
  each row's state was dropped from with probability `drop_state`."""
  step_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  keys = jax.random.split(step_key)
  carries = drop_carried_state(state.carries, drop_state, jax.random.fold_in(step_key, 1))
  return jax.grad(
    lambda params: objective(params, carries, inputs, targets, weights, keys), has_aux=True
  )(state.params)


def _apply_gradients(
  optimizer: optax.GradientTransformation, state: TrainState, grads, new_carries
) -> TrainState:
  """The state after the optimizer's update along `grads`, with the window's
  `new_carries` (gradients stopped) and the step counted."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  return state.replace(
    step=state.step + 1,
    params=optax.apply_updates(state.params, updates),
    opt_state=opt_state,
    carries=jax.lax.stop_gradient(new_carries),
  )


def _update_if_finite(finite: jax.Array, new_state: TrainState, state: TrainState) -> TrainState:
  """`new_state` where `finite`, else `state` as it was (the update dropped)
  but for the step, which still counts: it numbers the windows and the
  dropout keys."""
  kept = state.replace(step=state.step + 1)
  return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, kept)


def _objective(
  model: nn.Module,
  params,
  carries,
  inputs,
  targets,
  weights,
  keys,
  sum_over_time: bool,
  ar: float,
  tar: float,
  hold_padding: bool,
):
  """The train step's objective at `params` (before weight drop, with the
  step's weight-drop and dropout `keys`) and (the mean NLL, the new carries)."""
  weight_key, dropout_key = keys
  penalised = ar > 0 or tar > 0
  params = model.dropped_weights(params, weight_key)
  # A window's own steps: those scored in some row (row 0 is never padding).
  steps = jnp.any(weights > 0, axis=0)
  (logits, new_carries), sown = model.apply(
    {'params': params},
    inputs,
    carries,
    train=True,
    steps=steps if hold_padding else None,
    rngs={'dropout': dropout_key},
    mutable=['intermediates'] if penalised else [],
  )
  total, count = token_nll(logits, targets, weights)
  mean = total / jnp.maximum(count, 1.0)
  objective = mean * jnp.sum(steps) if sum_over_time else mean
  if penalised:
    outputs = sown['intermediates']['stack']  # what the stack sows (RecurrentLM)
    objective += activation_penalty(
      outputs['dropped_output'][0], ar, steps
    ) + temporal_activation_penalty(outputs['output'][0], tar, steps)
  return objective, (mean, new_carries)


def on_seed_axis(one_seed: Callable) -> Callable:
  """`one_seed(state, inputs, targets, weights)` for a state with a leading
  seed axis: vmapped over it, or for an axis of one, `one_seed` itself on
  the seed's slice (vmap over an axis of one reorders the computation, and
  rounding differs in the last bit)."""
  per_seed = jax.vmap(one_seed, in_axes=(0, None, None, None))

  def train_step(state: TrainState, inputs, targets, weights):
    if state.step.shape[0] > 1:
      return per_seed(state, inputs, targets, weights)
    new_state, metrics = one_seed(take_seed(state, 0), inputs, targets, weights)
    return stack([new_state]), stack([metrics])

  return train_step
