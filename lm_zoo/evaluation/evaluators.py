"""Evaluators: each way of scoring a trained model, as big_vision's
evaluators are, in two explicit steps:

  prepared = evaluator.prepare(model, params, corpus)   # what it chooses once
  result = evaluator.score(prepared, split)              # -> EvalResult

`prepare` returns a value (`Prepared`) holding the model, its weights, the
corpus and what the evaluator chose for them (a tuned temperature, a searched
dynamic-evaluation setting); `score` reads only that value, so scoring valid
and test shares one choice and nothing is remembered between weights.
`evaluator(model, params, corpus, split)` does both for one split.
`lm_zoo.evaluation.registry` builds one by name from a config section.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import logging
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.data import Corpus
from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.evaluation.checks import check_temperature, check_whole, check_windows, is_number
from lm_zoo.evaluation.mc_dropout import make_mc_dropout_eval_step, mc_dropout_carries
from lm_zoo.evaluation.results import EvalResult
from lm_zoo.evaluation.streams import (
  evaluate_stream,
  evaluate_stream_stacked,
  make_eval_step,
  token_losses,
  tune_temperature,
)
from lm_zoo.models.objective import check_token_ids

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What an evaluator scores with.

  Attributes:
    model: the model.
    params: its weights.
    corpus: the corpus whose splits are scored.
    choice: what `prepare` chose for these weights (None where nothing).
  """

  model: nn.Module
  params: Any = dataclasses.field(repr=False)
  corpus: Corpus = dataclasses.field(repr=False)
  choice: Any = None


class Evaluator(abc.ABC):
  """An evaluator's two steps; `prepare` chooses nothing by default, and
  each evaluator says how it scores."""

  def prepare(self, model: nn.Module, params: Any, corpus: Corpus) -> Prepared:
    return Prepared(model, params, corpus)

  @abc.abstractmethod
  def score(self, prepared: Prepared, split: str) -> EvalResult:
    """`split` scored with what `prepare` chose."""

  def choice_record(self, prepared: Prepared) -> Any:
    """What `prepare` chose, as JSON values that `prepare_from` takes back
    (None where it chooses nothing), so that a stopped evaluation resumes
    without choosing again."""
    return None

  def prepare_from(self, model: nn.Module, params: Any, corpus: Corpus, record: Any) -> Prepared:
    """`prepare` with the choice `choice_record` gave (chosen again where
    that is None); ValueError or TypeError for a record it could not have
    given."""
    return self.prepare(model, params, corpus)

  def prepare_many(
    self, model: nn.Module, params_list: Sequence, corpus: Corpus
  ) -> list[Prepared | TrainingError]:
    """`prepare` for each of several weights of one model (the seeds of a
    study), each one's TrainingError in its place; an evaluator that can
    prepare them together (`Dynamic`) does."""
    return [_outcome(self.prepare, model, params, corpus) for params in params_list]

  def score_many(
    self, prepared: Sequence[Prepared | TrainingError], split: str
  ) -> list[EvalResult | TrainingError]:
    """`score` of each prepared weights (`prepare_many`'s list), each one's
    TrainingError in its place; an entry that is one already (weights that
    could not be prepared) stays. An evaluator that can score several
    weights together (`Static`, `Dynamic`) does."""
    ready = [i for i, one in enumerate(prepared) if not isinstance(one, TrainingError)]
    outcomes = list(prepared)
    for i, outcome in zip(ready, self._score_ready([prepared[i] for i in ready], split)):
      outcomes[i] = outcome
    return outcomes

  def _score_ready(self, prepared: Sequence[Prepared], split: str) -> list:
    """`score_many` of prepared weights only: one by one."""
    return [_outcome(self.score, one, split) for one in prepared]

  def __call__(self, model: nn.Module, params: Any, corpus: Corpus, split: str) -> EvalResult:
    """`split` scored after preparing for these weights (for several splits,
    prepare once and score each)."""
    return self.score(self.prepare(model, params, corpus), split)


def _outcome(function, *args):
  try:
    return function(*args)
  except TrainingError as err:  # this weights' divergence, not the others'
    return err


def check_members(members: Any) -> None:
  """Raises ConfigError unless `members` (how many runs share one vmapped
  pass, 0: all) is a whole number >= 0."""
  check_whole(members, 'members', 0, ' (0: all at once)')


def one_model_and_corpus(prepared: Sequence[Prepared]) -> tuple[nn.Module, Corpus]:
  """The model and corpus every prepared weights shares, or ValueError."""
  model, corpus = prepared[0].model, prepared[0].corpus
  if any(p.model != model or p.corpus is not corpus for p in prepared):
    raise ValueError('score_many: every prepared weights must share one model and one corpus')
  return model, corpus


def first_tokens(
  corpus: Corpus, split: str, max_tokens: int, model=None, rows: int = 1
) -> np.ndarray:
  """The split's stream, cut to its first `max_tokens` scored tokens when > 0,
  its ids checked against `model`'s vocabulary.

  Raises:
    ConfigError: it scores fewer tokens than the `rows` of a batch.
  """
  stream = corpus.split(split)
  stream = stream[: max_tokens + 1] if max_tokens > 0 else stream
  if len(stream) - 1 < rows:
    raise ConfigError(
      f'the {split} split scores {max(len(stream) - 1, 0):,} tokens, fewer than batch_size '
      f'{rows:,} rows: lower batch_size' + (' or raise max_tokens' if max_tokens > 0 else '')
    )
  if model is not None:
    check_token_ids(stream, model.vocab_size, f'the {split} split')
  return stream


@dataclasses.dataclass(frozen=True)
class Static(Evaluator):
  """Dropout off, the state carried across the split (`evaluate_stream`),
  the logits divided by `temperature`. `score_many` scores `members`
  weights of one model in one pass, vmapped over them (0: all; 1: one by
  one, faster on a CPU), as dynamic evaluation's baseline does with its own
  `members`."""

  bptt: int
  batch_size: int = 1
  temperature: float = 1.0
  max_tokens: int = 0
  members: int = 1

  def __post_init__(self):
    check_windows(self.bptt, self.batch_size, self.max_tokens)
    check_temperature(self.temperature)
    check_members(self.members)

  def score(self, prepared: Prepared, split: str) -> EvalResult:
    model, corpus = prepared.model, prepared.corpus
    return evaluate_stream(
      make_eval_step(model),
      prepared.params,
      model.initialize_carry(self.batch_size),
      first_tokens(corpus, split, self.max_tokens, model, self.batch_size),
      self.batch_size,
      self.bptt,
      corpus.unit,
      self.temperature,
      what=f'{split} evaluation',
    )

  def _score_ready(self, prepared: Sequence[Prepared], split: str) -> list[EvalResult]:
    """Each prepared weights' `split`, `members` of them at a time in one
    vmapped pass (`evaluate_stream_stacked`); they share one model and corpus."""
    at_once = self.members or len(prepared)
    if at_once == 1 or len(prepared) < 2:
      return [self.score(one, split) for one in prepared]
    model, corpus = one_model_and_corpus(prepared)
    stream = first_tokens(corpus, split, self.max_tokens, model, self.batch_size)
    results = []
    for start in range(0, len(prepared), at_once):
      chunk = prepared[start : start + at_once]
      params = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(p.params for p in chunk))
      results += evaluate_stream_stacked(
        make_eval_step(model, stacked=True),
        params,
        model.initialize_carry(self.batch_size),
        stream,
        self.batch_size,
        self.bptt,
        corpus.unit,
        f'{split} evaluation of {len(chunk)} weights',
        self.temperature,
      )
    return results


@dataclasses.dataclass(frozen=True)
class MCDropout(Evaluator):
  """Monte-Carlo dropout: the predicted probabilities averaged over
  `samples` dropout masks, every dropout rate of the model multiplied by
  `dropout_scale` (`make_mc_dropout_eval_step`)."""

  bptt: int
  batch_size: int = 1
  samples: int = 50
  dropout_scale: float = 1.0
  seed: int = 0
  temperature: float = 1.0
  max_tokens: int = 0

  def __post_init__(self):
    check_windows(self.bptt, self.batch_size, self.max_tokens)
    check_whole(self.samples, 'samples', 1)
    if not (is_number(self.dropout_scale) and 0 <= self.dropout_scale < math.inf):
      raise ConfigError(f'dropout_scale must be >= 0, got {self.dropout_scale}')
    check_whole(self.seed, 'seed', 0)
    check_temperature(self.temperature)

  def score(self, prepared: Prepared, split: str) -> EvalResult:
    try:
      model = prepared.model.with_dropout_scaled(self.dropout_scale)
    except ValueError as err:
      raise ConfigError(f'mc_dropout.dropout_scale: {err}') from err
    carries = mc_dropout_carries(model, self.batch_size, self.samples, jax.random.key(self.seed))
    return evaluate_stream(
      _mc_dropout_step(model, self.samples),
      prepared.params,
      carries,
      first_tokens(prepared.corpus, split, self.max_tokens, model, self.batch_size),
      self.batch_size,
      self.bptt,
      prepared.corpus.unit,
      self.temperature,
      what=f'{split} evaluation',
    )


# One compiled step per model and sample count, however many passes a
# temperature search makes (keyed by the model's settings, not its weights).
_mc_dropout_step = functools.lru_cache(maxsize=8)(make_mc_dropout_eval_step)


@dataclasses.dataclass(frozen=True)
class TunedTemperature(Evaluator):
  """`base` (Static or MCDropout) at the softmax temperature in [low, high]
  that minimises its validation loss (`tune_temperature`): `prepare` tunes
  it, `score` uses it on every split."""

  base: Static | MCDropout
  low: float = 0.5
  high: float = 2.0
  tolerance: float = 0.01

  def __post_init__(self):
    if not isinstance(self.base, (Static, MCDropout)):
      raise ConfigError(f'base must be a Static or MCDropout evaluator, got {self.base!r}')
    bounds = (self.low, self.high, self.tolerance)
    # A tolerance as wide as [low, high] would search nothing.
    if not all(map(is_number, bounds)) or not (
      0 < self.low < self.high < math.inf and 0 < self.tolerance < self.high - self.low
    ):
      raise ConfigError(
        'need 0 < low < high (finite) and 0 < tolerance < high - low, got '
        f'low={self.low}, high={self.high}, tolerance={self.tolerance}'
      )

  def prepare(self, model, params, corpus: Corpus) -> Prepared:
    plain = Prepared(model, params, corpus)
    at = lambda t: dataclasses.replace(self.base, temperature=t).score(plain, 'valid').loss
    temperature = tune_temperature(at, self.low, self.high, self.tolerance)
    if min(temperature - self.low, self.high - temperature) <= self.tolerance:
      log.warning(
        'softmax temperature %.3f lies at the edge of [%g, %g]: the best may lie beyond it '
        '(widen temperature.low / temperature.high)',
        temperature,
        self.low,
        self.high,
      )
    else:
      log.info('softmax temperature %.3f minimises the validation loss', temperature)
    return dataclasses.replace(plain, choice=temperature)

  def choice_record(self, prepared: Prepared) -> float:
    return prepared.choice

  def prepare_from(self, model, params, corpus: Corpus, record: Any) -> Prepared:
    if record is None:
      return self.prepare(model, params, corpus)
    if not (is_number(record) and self.low <= record <= self.high):
      raise ValueError(f'a tuned temperature in [{self.low}, {self.high}], not {record!r}')
    return Prepared(model, params, corpus, float(record))

  def score(self, prepared: Prepared, split: str) -> EvalResult:
    return dataclasses.replace(self.base, temperature=prepared.choice).score(prepared, split)


@dataclasses.dataclass(frozen=True)
class TokenLosses(Evaluator):
  """Each token's NLL given every token before it, at batch 1 and dropout
  off (`token_losses`), in the result's details; the loss is their mean."""

  bptt: int
  max_tokens: int = 0

  def __post_init__(self):
    check_windows(self.bptt, max_tokens=self.max_tokens)

  def score(self, prepared: Prepared, split: str) -> EvalResult:
    losses = token_losses(
      prepared.model,
      prepared.params,
      first_tokens(prepared.corpus, split, self.max_tokens, prepared.model),
      self.bptt,
    )
    return EvalResult(
      float(np.mean(losses)), len(losses), prepared.corpus.unit, details={'token_losses': losses}
    )


def beside_static(result: EvalResult, static: EvalResult) -> EvalResult:
  """A dynamic evaluation's result with the static score of the same tokens
  at the same batch size in its details, the measure of its gain."""
  return dataclasses.replace(result, details={**result.details, 'static_loss': static.loss})
