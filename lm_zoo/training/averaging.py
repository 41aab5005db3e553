"""The triggers that switch parameter averaging on
(`lm_zoo.optim.parameter_averaging`): AWD-LSTM's non-monotone trigger
(NT-ASGD, Merity et al. 2018), a validation plateau, a fraction of training,
or lamb's patience (so many steps without a new best, or a given step at the
latest)."""

from __future__ import annotations

import math
from typing import Sequence

import ml_collections

from lm_zoo.configs import check_choice

TRIGGERS = ('none', 'always', 'nonmonotone', 'plateau', 'fraction', 'patience')


def should_start_averaging(
  cfg: ml_collections.ConfigDict,
  valid_loss: float,
  past_valid_losses: Sequence[float],
  epoch: int,
  num_epochs: int,
) -> bool:
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
  check_choice('averaging.trigger', cfg.trigger, TRIGGERS)
  past = list(past_valid_losses)
  if cfg.trigger == 'nonmonotone':
    return len(past) > cfg.nonmono and valid_loss > min(past[: -cfg.nonmono])
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
    step - best_step >= cfg.patience_steps or 0 < cfg.latest_step <= step
  )
