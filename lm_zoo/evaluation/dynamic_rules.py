"""Dynamic evaluation's update rules by name (`dynamic.rule`).

Each registered rule says which of the searched settings it reads and how
its optax transformation is made from them; the `Dynamic` evaluator, the
config checks and the tuner's report read the registry, so adding a rule
is its transformation and one `register_dynamic_rule` line (docs/design.md
shows one).

    >>> sign_descent = lambda learning_rate: optax.chain(
    ...     optax.scale_by_sign(), optax.scale_by_learning_rate(learning_rate))
    >>> register_dynamic_rule('sign', DynamicRuleSpec(
    ...     ('learning_rate',), lambda statistics, decay_mean: sign_descent))
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, Callable

import optax

from lm_zoo.optim import dynamic_rms, dynamic_sgd

# The settings a rule can read; each is searched over the config's values
# (`dynamic.learning_rate`, `dynamic.decay`, `dynamic.eps`).
SEARCHED = ('learning_rate', 'decay', 'eps')


@dataclasses.dataclass(frozen=True)
class DynamicRuleSpec:
  """How the `Dynamic` evaluator builds one update rule.

  Attributes:
    hyperparameters: the searched settings it reads, of `SEARCHED`; the
      others stay at 0 in its settings.
    make: (statistics, decay_mean) -> a function of those settings (as
      keyword arguments) returning the `optax.GradientTransformation`. It is
      wrapped in `optax.inject_hyperparams`, so that one compiled scan scores
      every setting of a segment length.
    statistics: whether it reads MS, the root mean square of training
      gradients (`rms_training_gradients`, passed to `make`), and
      `dynamic.decay_mean`; else `make` gets None.
    positive: the settings that must be above 0 (the others: >= 0).
  """

  hyperparameters: tuple[str, ...]
  make: Callable[[Any, str], Callable[..., optax.GradientTransformation]]
  statistics: bool = False
  positive: tuple[str, ...] = ()

  def __post_init__(self):
    unknown = set(self.hyperparameters) - set(SEARCHED)
    if unknown or not set(self.positive) <= set(self.hyperparameters):
      raise ValueError(
        f'a rule reads settings of {SEARCHED} (and positive ones among them), '
        f'got {self.hyperparameters} and {self.positive}'
      )

  def used(self) -> tuple[str, ...]:
    """Every setting a run of the rule depends on."""
    return (*self.hyperparameters, 'segment_length', *(('decay_mean',) if self.statistics else ()))


DYNAMIC_RULES: dict[str, DynamicRuleSpec] = {}


def register_dynamic_rule(name: str, spec: DynamicRuleSpec) -> None:
  """Makes `dynamic.rule = name` score with `spec`'s transformation."""
  DYNAMIC_RULES[name] = spec


class DynamicRule(enum.StrEnum):
  """The update rules lm_zoo registers (`dynamic.rule`)."""

  SGD = 'sgd'
  RMS = 'rms'


register_dynamic_rule(
  DynamicRule.SGD,
  DynamicRuleSpec(('learning_rate', 'decay'), lambda statistics, decay_mean: dynamic_sgd),
)
register_dynamic_rule(
  DynamicRule.RMS,
  DynamicRuleSpec(
    SEARCHED,
    lambda statistics, decay_mean: functools.partial(
      dynamic_rms, rms_gradients=statistics, decay_mean=decay_mean
    ),
    statistics=True,
    positive=('eps',),
  ),
)
