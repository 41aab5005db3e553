"""Evaluators by name: each registered name builds its evaluator from its
section of an evaluation config (`lm_zoo.configs.evaluation_config`),
checking that section's fields. `build_evaluator` is what `lm-zoo-eval`, a
training run's final evaluation and the tuner call.

Adding an evaluator is its class (`lm_zoo.evaluation.evaluators.Evaluator`)
and one `register_evaluator` line; docs/design.md shows one.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Callable

import ml_collections

from lm_zoo.errors import ConfigError, is_whole_number
from lm_zoo.evaluation.dynamic_evaluators import Dynamic, Learned
from lm_zoo.evaluation.dynamic_rules import DYNAMIC_RULES
from lm_zoo.evaluation.evaluators import Evaluator, MCDropout, Static, TokenLosses, TunedTemperature
from lm_zoo.evaluation.meta_training import MetaLearner
from lm_zoo.optim import DECAY_MEANS


@dataclasses.dataclass(frozen=True)
class Windows:
  """How the builders' evaluators cut the stream: `bptt` tokens a window,
  `batch_size` rows, and the meta-learner for 'learned'."""

  bptt: int
  batch_size: int
  meta_learner: MetaLearner | None = None


# build(config, windows) -> the evaluator its section describes, or ConfigError.
Builder = Callable[[ml_collections.ConfigDict, Windows], Evaluator]
REGISTRY: dict[str, Builder] = {}


def register_evaluator(name: str, build: Builder) -> None:
  """Makes `evaluation.evaluator = name` build with `build`."""
  REGISTRY[name] = build


def build_evaluator(
  config: ml_collections.ConfigDict,
  *,
  bptt: int,
  batch_size: int,
  meta_learner: MetaLearner | None = None,
) -> Evaluator:
  """The evaluator `config.evaluator` names (`evaluation_config`), windows
  of `bptt` tokens and `batch_size` rows (dynamic evaluation and the learned
  rule: `config.batch_size`, else 1); 'learned' scores with `meta_learner`.

  Raises ConfigError for a name or setting that cannot run, naming the field.
  """
  name = config.evaluator
  if name not in REGISTRY:
    raise ConfigError(
      f'unknown evaluator {name!r} (evaluator): choose one of {", ".join(REGISTRY)}'
    )
  for field in ('batch_size', 'max_tokens'):
    if config[field] < 0:
      raise ConfigError(f'{field} must be >= 0 (0: the default), got {config[field]}')
  return REGISTRY[name](config, Windows(bptt, batch_size, meta_learner))


def _temperature(value: float, section: str) -> float:
  if not (math.isfinite(value) and value > 0):
    raise ConfigError(f'{section}.temperature must be a positive number, got {value}')
  return float(value)


def _static(config: ml_collections.ConfigDict, windows: Windows) -> Static:
  return Static(
    windows.bptt,
    windows.batch_size,
    _temperature(config.static.temperature, 'static'),
    config.max_tokens,
  )


def _mc_dropout(config: ml_collections.ConfigDict, windows: Windows) -> MCDropout:
  cfg = config.mc_dropout
  if cfg.samples < 1:
    raise ConfigError(f'mc_dropout.samples must be at least 1, got {cfg.samples}')
  if not (math.isfinite(cfg.dropout_scale) and cfg.dropout_scale >= 0):
    raise ConfigError(f'mc_dropout.dropout_scale must be >= 0, got {cfg.dropout_scale}')
  return MCDropout(
    windows.bptt,
    windows.batch_size,
    cfg.samples,
    cfg.dropout_scale,
    cfg.seed,
    _temperature(cfg.temperature, 'mc_dropout'),
    config.max_tokens,
  )


def _tuned_temperature(config: ml_collections.ConfigDict, windows: Windows) -> TunedTemperature:
  cfg = config.temperature
  if cfg.base not in ('static', 'mc_dropout'):
    raise ConfigError(f"temperature.base must be 'static' or 'mc_dropout', got {cfg.base!r}")
  if not 0 < cfg.low < cfg.high or not cfg.tolerance > 0:
    raise ConfigError(
      'temperature: need 0 < low < high and tolerance > 0, got '
      f'low={cfg.low}, high={cfg.high}, tolerance={cfg.tolerance}'
    )
  base = (
    Static(windows.bptt, windows.batch_size, max_tokens=config.max_tokens)
    if cfg.base == 'static'
    else _mc_dropout(config, windows)
  )
  return TunedTemperature(base, cfg.low, cfg.high, cfg.tolerance)


def _dynamic(config: ml_collections.ConfigDict, windows: Windows) -> Dynamic:
  cfg = config.dynamic
  if cfg.rule not in DYNAMIC_RULES:
    raise ConfigError(
      f'unknown dynamic.rule {cfg.rule!r}: choose one of {", ".join(DYNAMIC_RULES)}'
    )
  rule = DYNAMIC_RULES[cfg.rule]
  if cfg.decay_mean not in DECAY_MEANS:
    raise ConfigError(
      f'dynamic.decay_mean must be one of {", ".join(DECAY_MEANS)}, got {cfg.decay_mean!r}'
    )
  for field in ('learning_rate', 'decay', 'eps', 'segment_length'):
    # a tuple override's values arrive as text where they are no number ('nan')
    if not cfg[field] or not all(
      isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
      for v in cfg[field]
    ):
      raise ConfigError(f'dynamic.{field} must be one or more numbers >= 0, got {cfg[field]}')
  if min(cfg.segment_length) < 1:
    raise ConfigError(f'dynamic.segment_length must be >= 1, got {cfg.segment_length}')
  for field in rule.positive:
    if min(cfg[field]) <= 0:
      raise ConfigError(f'dynamic.{field} must be > 0 for rule {cfg.rule!r}, got {cfg[field]}')
  for field in ('ms_batches', 'ms_batch_size'):
    if cfg[field] < 1:
      raise ConfigError(f'dynamic.{field} must be at least 1, got {cfg[field]}')
  if cfg.search_tokens < 0:
    raise ConfigError(f'dynamic.search_tokens must be >= 0, got {cfg.search_tokens}')
  if not is_whole_number(cfg.members) or cfg.members < 0:
    raise ConfigError(
      f'dynamic.members must be a whole number >= 0 (0: every run at once), got {cfg.members!r}'
    )
  return Dynamic(
    windows.bptt,
    cfg.rule,
    tuple(cfg.learning_rate),
    tuple(cfg.decay),
    tuple(cfg.eps),
    tuple(int(n) for n in cfg.segment_length),
    cfg.decay_mean,
    cfg.ms_batches,
    cfg.ms_batch_size,
    cfg.search_tokens,
    config.batch_size or 1,
    config.max_tokens,
    cfg.members,
  )


def _learned(config: ml_collections.ConfigDict, windows: Windows) -> Learned:
  if windows.meta_learner is None:
    raise ConfigError(
      'the learned evaluator needs a meta-learner: run lm-zoo-meta-train '
      'first, or set learned.meta_learner'
    )
  return Learned(windows.meta_learner, windows.bptt, config.batch_size or 1, config.max_tokens)


def _token_losses(config: ml_collections.ConfigDict, windows: Windows) -> TokenLosses:
  return TokenLosses(windows.bptt, config.max_tokens)


class EvaluatorName(enum.StrEnum):
  """The evaluators lm_zoo registers (`evaluation.evaluator`); each is its
  string, so `'dynamic'` and `EvaluatorName.DYNAMIC` are one choice."""

  STATIC = 'static'
  MC_DROPOUT = 'mc_dropout'
  TEMPERATURE = 'temperature'
  DYNAMIC = 'dynamic'
  LEARNED = 'learned'
  TOKEN_LOSSES = 'token_losses'


register_evaluator(EvaluatorName.STATIC, _static)
register_evaluator(EvaluatorName.MC_DROPOUT, _mc_dropout)
register_evaluator(EvaluatorName.TEMPERATURE, _tuned_temperature)
register_evaluator(EvaluatorName.DYNAMIC, _dynamic)
register_evaluator(EvaluatorName.LEARNED, _learned)
register_evaluator(EvaluatorName.TOKEN_LOSSES, _token_losses)


def split_names(splits) -> tuple[str, ...]:
  """`evaluation.splits` as names; 'valid,test' from a command line counts
  as two."""
  names = tuple(name.strip() for entry in splits for name in entry.split(',') if name.strip())
  unknown = [name for name in names if name not in ('train', 'valid', 'test')]
  if unknown:
    raise ConfigError(f'splits: unknown split {unknown[0]!r}; choose from train, valid, test')
  return names
