"""Optimizers and learning-rate schedules from the config."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import optax

from lm_zoo.configs import check_choice
from lm_zoo.optim import parameter_averaging
from lm_zoo.training.averaging import TRIGGERS

# Optimizer name -> update(optimizer config, learning rate): the step after
# clipping and penalties, an optax transformation; `register_optimizer` adds one.
OPTIMIZERS: dict[str, Callable[[ml_collections.ConfigDict, Any], optax.GradientTransformation]] = {
  'sgd': lambda cfg, lr: optax.sgd(lr, momentum=cfg.momentum or None),
  'adam': lambda cfg, lr: optax.adam(lr, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps),
  # Adam with Nesterov momentum: the dual connection paper's optimizer.
  'nadam': lambda cfg, lr: optax.nadam(lr, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps),
}
LOSS_REDUCTIONS = ('mean', 'sum_over_time')  # optimizer.loss_reduction (make_train_step)


def register_optimizer(
  name: str, update: Callable[[ml_collections.ConfigDict, Any], optax.GradientTransformation]
) -> None:
  """Makes `optimizer.name = name` step with `update(optimizer_config,
  learning_rate)` (the learning rate an injected hyper-parameter: pass it
  on as the transformation's own)."""
  OPTIMIZERS[name] = update


def make_optimizer(
  cfg: ml_collections.ConfigDict, averaging: str = 'none'
) -> optax.GradientTransformation:
  """clip by global norm -> L2 penalties (all parameters; the dual layer's
  own) -> SGD, Adam or Nadam -> parameter averaging (with `l2_before_clip`
  the L2 penalties come before the clipping, as a penalty in the objective),
  from `config.optimizer` and `config.averaging.trigger` (`averaging`):
  'none' keeps no average, 'always' averages from the first step, any other
  trigger keeps an average that `start_averaging` switches on.

  The learning rate is an injected hyper-parameter (`set_learning_rate`) so
  that epoch schedules and plateau drops change it without recompiling.
  Adam with beta1 = 0 is the Mogrifier paper's RMSProp-like setting.
  """
  check_choice('optimizer.name', cfg.name, OPTIMIZERS)
  check_choice('averaging.trigger', averaging, TRIGGERS)

  def build(learning_rate):
    penalties = []
    if cfg.l2 > 0:
      penalties.append(optax.add_decayed_weights(cfg.l2))
    if cfg.dual_l2 > 0:
      # The dual connection is the model's bridge (`build_model`).
      penalties.append(optax.add_decayed_weights(cfg.dual_l2, mask=module_mask('bridge')))
    clip = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
    parts = penalties + clip if cfg.l2_before_clip else clip + penalties
    parts.append(OPTIMIZERS[cfg.name](cfg, learning_rate))
    if averaging != 'none':
      parts.append(parameter_averaging(start=averaging == 'always'))
    return optax.chain(*parts)

  return optax.inject_hyperparams(build)(learning_rate=cfg.learning_rate)


def module_mask(name: str) -> Callable[[Any], Any]:
  """A mask function for optax: True on the parameters of the top-level
  module `name` (a part of `RecurrentLM`: 'embedding', 'stack', 'bridge' or
  'head'), False elsewhere."""

  def mask(params):
    return {
      module: jax.tree.map(lambda _, m=module: m == name, subtree)
      for module, subtree in params.items()
    }

  return mask


def set_learning_rate(opt_state, learning_rate: float):
  """Returns `opt_state` (from `make_optimizer`) with a new learning rate."""
  hyperparams = dict(opt_state.hyperparams)
  old = hyperparams['learning_rate']
  new = jnp.asarray(learning_rate, old.dtype)
  # Laid out as the old rate (replicated over a mesh, committed to its
  # device): another layout would compile the train step again.
  sharding = getattr(old, 'sharding', None)
  if sharding is not None:
    new = jax.device_put(new, sharding)
  hyperparams['learning_rate'] = new
  return opt_state._replace(hyperparams=hyperparams)


def _plateau_drops(cfg: ml_collections.ConfigDict, epoch: int, valid_losses: Sequence[float]):
  """The finished epochs whose validation loss did not improve on the best before it."""
  del cfg, epoch
  drops, best = 0, math.inf
  for loss in valid_losses:
    if loss < best:
      best = loss
    else:
      drops += 1
  return drops


# schedule.kind -> drops(schedule config, epoch, validation losses so far):
# how many times the rate has been multiplied by `factor` (`epoch_learning_rate`).
SCHEDULES: dict[str, Callable[[ml_collections.ConfigDict, int, Sequence[float]], int]] = {
  'constant': lambda cfg, epoch, losses: 0,
  'exponential': lambda cfg, epoch, losses: max(0, epoch - cfg.decay_after),
  'milestones': lambda cfg, epoch, losses: sum(1 for m in cfg.milestones if m < epoch),
  'plateau': _plateau_drops,
}


def epoch_learning_rate(
  cfg: ml_collections.ConfigDict, base_lr: float, epoch: int, valid_losses: Sequence[float]
) -> float:
  """The learning rate for `epoch` (1-based) from `config.schedule`:
  base_lr * factor ** drops, where `SCHEDULES[kind]` counts the drops:

    constant: none.
    exponential: max(0, epoch - decay_after) (Zaremba et al.'s small model:
      lr 1 for 5 epochs in their code, 4 in their text, then halved every epoch).
    milestones: the milestones < epoch (aLSTM: lr / 10 at epochs 100 and 160).
    plateau: the finished epochs whose validation loss did not improve on
      the best before it.

  The rate never goes below `min_lr`. It is a function of the epoch and the
  validation history alone, so a resumed run recomputes the same value.
  """
  check_choice('schedule.kind', cfg.kind, SCHEDULES)
  drops = SCHEDULES[cfg.kind](cfg, epoch, valid_losses)
  return max(base_lr * cfg.factor**drops, cfg.min_lr)
