"""What dynamic evaluation chooses for one set of weights: a setting
(`DynamicEvalSettings`), what every setting of those weights shares
(`DynamicSetup`) and the search's outcome (`DynamicChoice`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import optax

from lm_zoo.evaluation.dynamic_rules import DYNAMIC_RULES
from lm_zoo.evaluation.results import EvalResult


@dataclasses.dataclass(frozen=True)
class DynamicEvalSettings:
  """One dynamic-evaluation setting: `rule` (a name of `DYNAMIC_RULES`, or
  'learned'), the learning rate eta, the decay lambda toward the trained
  weights, RMS's epsilon, the segment length and what RMS's mean(MS) is over
  ('coordinates' as lamb, or 'tensors' as Krause; `dynamic_rms`). A setting
  the rule does not read is 0."""

  rule: str
  learning_rate: float
  decay: float
  eps: float
  segment_length: int
  decay_mean: str = 'coordinates'

  def used(self) -> dict[str, Any]:
    """The settings its rule reads (the learned rule: its segment length)."""
    names = DYNAMIC_RULES[self.rule].used() if self.rule in DYNAMIC_RULES else ('segment_length',)
    return {'rule': self.rule, **{name: getattr(self, name) for name in names}}


@dataclasses.dataclass(frozen=True)
class DynamicSetup:
  """What every setting of one set of weights shares: the training
  gradients' MS (None for a rule that does not read it) and, per rule and
  kind of mean(MS), one transformation whose values live in its state
  (`optax.inject_hyperparams`), so that scoring many settings compiles the
  scan once per segment length, not once per setting (and the setups of
  other weights reuse it: `dynamic_evaluate`).

  Attributes:
    rms_gradients: MS (`rms_training_gradients`), or None.
    transformations: (rule, decay_mean) -> the injected transformation,
      filled as settings ask for them.
    states: (rule, decay_mean) -> (the weights, the transformation's initial
      state for them).
  """

  rms_gradients: Any = dataclasses.field(default=None, repr=False)
  transformations: dict = dataclasses.field(default_factory=dict, repr=False)
  states: dict = dataclasses.field(default_factory=dict, repr=False)

  def transformation(
    self, settings: DynamicEvalSettings, params
  ) -> tuple[optax.GradientTransformation, Any]:
    """The transformation of `settings` and its initial state."""
    rule = DYNAMIC_RULES[settings.rule]
    values = {name: getattr(settings, name) for name in rule.hyperparameters}
    key = (settings.rule, settings.decay_mean)
    if key not in self.transformations:
      factory = rule.make(self.rms_gradients, settings.decay_mean)
      self.transformations[key] = optax.inject_hyperparams(factory)(**values)
    injected = self.transformations[key]
    # The inner state (theta_g and MS / mean(MS)) does not depend on the
    # values: every setting shares one, which `dynamic_evaluate_many` then
    # passes once rather than stacking a copy per setting.
    start, state = self.states.get(key, (None, None))
    if start is not params:
      state = injected.init(params)
      self.states[key] = params, state
    return injected, state._replace(
      hyperparams={k: jnp.asarray(v, jnp.float32) for k, v in values.items()}
    )


@dataclasses.dataclass(frozen=True)
class DynamicChoice:
  """What `Dynamic.prepare` chose: the setting, every searched setting's
  validation loss (inf where it diverged), the chosen setting's validation
  result where the search scored all of valid, and the shared setup."""

  settings: DynamicEvalSettings
  trials: list = dataclasses.field(default_factory=list)
  valid: EvalResult | None = dataclasses.field(default=None, repr=False)
  setup: DynamicSetup = dataclasses.field(default_factory=DynamicSetup, repr=False)
