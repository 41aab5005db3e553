"""Search spaces: named hyper-parameters, each a config field and its range.

A space is an `ml_collections.ConfigDict` of entries made by `param`, keyed
by the name the tuner and the report use (the Mogrifier paper's names), so a
range can be changed from the command line:
`--tune.space.learning_rate.high=0.01`. The ranges of the Mogrifier paper's
appendix A are `mogrifier_table4`, `mogrifier_table5` (Enwik8) and
`dyneval_table6`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import ml_collections

from lm_zoo.errors import ConfigError


def param(
  field: str, low: float, high: float, *, log: bool = False, integer: bool = False
) -> ml_collections.ConfigDict:
  """One hyper-parameter: the config `field` it sets (dotted, as in
  lm_zoo/configs.py) and its range [low, high], sampled on a log scale when
  `log`, as whole numbers when `integer`."""
  return ml_collections.ConfigDict(
    {'field': field, 'low': low, 'high': high, 'log': log, 'integer': integer}
  )


def mogrifier_table4(mogrifier: bool) -> ml_collections.ConfigDict:
  """The Mogrifier paper's Table 4 (every task but Enwik8). The rounds r and
  the rank k are tuned for the Mogrifier only; k <= 0 means full rank, as in
  the paper (and model.mogrifier.rank)."""
  space = ml_collections.ConfigDict(
    {
      'learning_rate': param('optimizer.learning_rate', 1e-3, 4e-3, log=True),
      'input_embedding_ratio': param('model.embed_ratio', 0.0, 2.0),
      'l2_penalty': param('optimizer.l2', 5e-6, 1e-3, log=True),
      'input_dropout': param('model.dropout_input', 0.0, 0.9),
      'inter_layer_dropout': param('model.dropout_hidden', 0.0, 0.95),
      'state_dropout': param('model.dropout_state', 0.0, 0.8),
      'output_dropout': param('model.dropout_output', 0.0, 0.95),
    }
  )
  if mogrifier:
    space.mogrifier_rounds = param('model.mogrifier.rounds', 0, 6, integer=True)
    space.mogrifier_rank = param('model.mogrifier.rank', -20, 100, integer=True)
  return space


def mogrifier_table5(mogrifier: bool) -> ml_collections.ConfigDict:
  """The Mogrifier paper's Table 5 (Enwik8): no embedding ratio, tighter dropouts."""
  space = mogrifier_table4(mogrifier)
  del space['input_embedding_ratio']
  space.input_dropout.high = 0.2
  space.inter_layer_dropout.high = 0.2
  space.state_dropout.high = 0.25
  space.output_dropout.high = 0.25
  return space


def dyneval_table6(unit: str = 'word') -> ml_collections.ConfigDict:
  """The Mogrifier paper's Table 6, over the fields of
  `DynamicEvalSettings`: segments of at most 20 tokens for words, 50 for
  characters."""
  return ml_collections.ConfigDict(
    {
      'max_time_steps': param('segment_length', 1, 20 if unit == 'word' else 50, integer=True),
      'dyneval_learning_rate': param('learning_rate', 1e-6, 1e-3, log=True),
      'dyneval_decay_rate': param('decay', 1e-6, 1e-2, log=True),
      'dyneval_epsilon': param('eps', 1e-8, 1e-2, log=True),
    }
  )


def check_space(space: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for an empty space or an impossible range."""
  if not space:
    raise ConfigError('the search space (tune.space) is empty')
  for name, spec in space.items():
    if not spec.low <= spec.high:
      raise ConfigError(f'tune.space.{name}: low {spec.low} is above high {spec.high}')
    if spec.log and spec.low <= 0:
      raise ConfigError(f'tune.space.{name}: a log-scale range needs low > 0, got {spec.low}')


def suggest(trial, space: ml_collections.ConfigDict) -> dict[str, Any]:
  """The values an Optuna trial samples for each hyper-parameter of `space`."""
  values = {}
  for name, spec in space.items():
    if spec.integer:
      values[name] = trial.suggest_int(name, int(spec.low), int(spec.high), log=spec.log)
    else:
      values[name] = trial.suggest_float(name, spec.low, spec.high, log=spec.log)
  return values


def set_fields(
  config: ml_collections.ConfigDict, space: ml_collections.ConfigDict, values: Mapping[str, Any]
) -> ml_collections.ConfigDict:
  """A copy of `config` with each hyper-parameter's field set to its value."""
  config = ml_collections.ConfigDict(config.to_dict())
  for name, value in values.items():
    *sections, field = space[name].field.split('.')
    target = config
    for section in sections:
      target = target[section]
    if field not in target:
      raise ConfigError(f'tune.space.{name} sets {space[name].field}, which is not a config field')
    target[field] = type(target[field])(value)  # a sampled 3.0 into an int field
  return config


def position(value: float, spec: ml_collections.ConfigDict) -> float:
  """Where `value` lies in its range, from 0 (low) to 1 (high); log-scale
  ranges are measured in log space."""
  low, high, value = spec.low, spec.high, float(value)
  if spec.log:
    low, high, value = math.log(low), math.log(high), math.log(value)
  return 0.5 if high == low else (value - low) / (high - low)
