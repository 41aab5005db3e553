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
from typing import Callable

import ml_collections

from lm_zoo.data.corpora import SPLITS
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation.checks import check_whole
from lm_zoo.evaluation.dynamic_evaluators import Dynamic, Learned
from lm_zoo.evaluation.evaluators import Evaluator, MCDropout, Static, TokenLosses, TunedTemperature
from lm_zoo.evaluation.meta_training import MetaLearner


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
# The evaluators that score with a meta-learner: each run's own, trained for
# it after training (lm-zoo-meta-train), so read with the run's weights.
META_LEARNED: set[str] = set()


def register_evaluator(name: str, build: Builder, meta_learned: bool = False) -> None:
  """Makes `evaluation.evaluator = name` build with `build`; `meta_learned`:
  it scores with a run's meta-learner (`Windows.meta_learner`)."""
  REGISTRY[name] = build
  if meta_learned:
    META_LEARNED.add(name)
  else:
    META_LEARNED.discard(name)


def needs_meta_learner(config: ml_collections.ConfigDict) -> bool:
  """Whether the evaluator `config` names scores with a run's meta-learner."""
  return config.evaluator in META_LEARNED


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
    check_whole(config[field], field, 0, ' (0: the default)')
  split_names(config.splits)
  return REGISTRY[name](config, Windows(bptt, batch_size, meta_learner))


def _in_section(section: str, build: Callable[[], Evaluator]) -> Evaluator:
  """`build()`, its errors naming the config's fields ('static.' + the
  evaluator's attribute)."""
  try:
    return build()
  except ConfigError as err:
    raise ConfigError(f'{section}{err}') from None


def _static(config: ml_collections.ConfigDict, windows: Windows) -> Static:
  return _in_section(
    'static.',
    lambda: Static(windows.bptt, windows.batch_size, config.static.temperature, config.max_tokens),
  )


def _mc_dropout(config: ml_collections.ConfigDict, windows: Windows) -> MCDropout:
  cfg = config.mc_dropout
  return _in_section(
    'mc_dropout.',
    lambda: MCDropout(
      windows.bptt,
      windows.batch_size,
      cfg.samples,
      cfg.dropout_scale,
      cfg.seed,
      cfg.temperature,
      config.max_tokens,
    ),
  )


def _tuned_temperature(config: ml_collections.ConfigDict, windows: Windows) -> TunedTemperature:
  cfg = config.temperature
  if cfg.base not in ('static', 'mc_dropout'):
    raise ConfigError(f"temperature.base must be 'static' or 'mc_dropout', got {cfg.base!r}")
  base = (
    Static(windows.bptt, windows.batch_size, max_tokens=config.max_tokens)
    if cfg.base == 'static'
    else _mc_dropout(config, windows)
  )
  return _in_section(
    'temperature: ', lambda: TunedTemperature(base, cfg.low, cfg.high, cfg.tolerance)
  )


def _dynamic(config: ml_collections.ConfigDict, windows: Windows) -> Dynamic:
  cfg = config.dynamic
  return _in_section(
    'dynamic.',
    lambda: Dynamic(
      windows.bptt,
      cfg.rule,
      cfg.learning_rate,
      cfg.decay,
      cfg.eps,
      cfg.segment_length,
      cfg.decay_mean,
      cfg.ms_batches,
      cfg.ms_batch_size,
      cfg.search_tokens,
      config.batch_size or 1,
      config.max_tokens,
      cfg.members,
    ),
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
register_evaluator(EvaluatorName.LEARNED, _learned, meta_learned=True)
register_evaluator(EvaluatorName.TOKEN_LOSSES, _token_losses)


def split_names(splits, required: bool = False) -> tuple[str, ...]:
  """`evaluation.splits` as names; 'valid,test' from a command line counts
  as two. No split is refused where `required` (an evaluation scores at
  least one)."""
  if isinstance(splits, str) or not all(isinstance(entry, str) for entry in splits):
    raise ConfigError(f'splits must be a tuple of split names, got {splits!r}')
  names = tuple(name.strip() for entry in splits for name in entry.split(',') if name.strip())
  unknown = [name for name in names if name not in SPLITS]
  if unknown:
    raise ConfigError(f'splits: unknown split {unknown[0]!r}; choose from {", ".join(SPLITS)}')
  if required and not names:
    raise ConfigError(
      f'splits is empty: name one or more of {", ".join(SPLITS)} (splits=valid,test)'
    )
  return names
