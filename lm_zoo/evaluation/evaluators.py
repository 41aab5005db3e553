"""Evaluators: each way of scoring a trained model, built from a config
section (`lm_zoo.configs.evaluation_config`) and run as

  evaluator(model, params, corpus, split) -> EvalResult

as big_vision's evaluators are. `build_evaluator` picks one by name
(`evaluation.evaluator`); `lm-zoo-eval --config=...`, a training run's final
evaluation and the tuner all go through it. An evaluator remembers what it
chose for the weights it last scored (a tuned temperature, a searched
dynamic-evaluation setting) and reuses it on the next split.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm_zoo.configs import EVALUATORS
from lm_zoo.data import Corpus
from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.evaluation.dynamic import dynamic_evaluate
from lm_zoo.evaluation.mc_dropout import make_mc_dropout_eval_step, mc_dropout_carries
from lm_zoo.evaluation.meta_training import MetaLearner
from lm_zoo.evaluation.results import EvalResult
from lm_zoo.evaluation.statistics import rms_training_gradients
from lm_zoo.evaluation.streams import (evaluate_stream, make_eval_step, token_losses,
                                       tune_temperature)
from lm_zoo.models.objective import check_token_ids
from lm_zoo.optim import DECAY_MEANS, dynamic_rms, dynamic_sgd
from lm_zoo.progress import eta

log = logging.getLogger(__name__)

Evaluator = Callable[[nn.Module, Any, Corpus, str], EvalResult]
RULES = ('sgd', 'rms')


def _first_tokens(corpus: Corpus, split: str, max_tokens: int, model=None) -> np.ndarray:
  """The split's stream, cut to its first `max_tokens` scored tokens when > 0,
  its ids checked against `model`'s vocabulary."""
  stream = corpus.split(split)
  stream = stream[:max_tokens + 1] if max_tokens > 0 else stream
  if model is not None:
    check_token_ids(stream, model.vocab_size, f'the {split} split')
  return stream


@dataclasses.dataclass
class Static:
  """Dropout off, the state carried across the split (`evaluate_stream`),
  the logits divided by `temperature`."""

  bptt: int
  batch_size: int = 1
  temperature: float = 1.0
  max_tokens: int = 0

  def __call__(self, model, params, corpus: Corpus, split: str) -> EvalResult:
    return evaluate_stream(make_eval_step(model), params,
                           model.initialize_carry(self.batch_size),
                           _first_tokens(corpus, split, self.max_tokens, model), self.batch_size,
                           self.bptt, corpus.unit, self.temperature,
                           what=f'{split} evaluation')


@dataclasses.dataclass
class MCDropout:
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

  def __call__(self, model, params, corpus: Corpus, split: str) -> EvalResult:
    try:
      model = model.with_dropout_scaled(self.dropout_scale)
    except ValueError as err:
      raise ConfigError(f'mc_dropout.dropout_scale: {err}') from err
    carries = mc_dropout_carries(model, self.batch_size, self.samples,
                                 jax.random.key(self.seed))
    return evaluate_stream(_mc_dropout_step(model, self.samples), params, carries,
                           _first_tokens(corpus, split, self.max_tokens, model), self.batch_size,
                           self.bptt, corpus.unit, self.temperature,
                           what=f'{split} evaluation')


# One compiled step per model and sample count, however many passes a
# temperature search makes.
_mc_dropout_step = functools.lru_cache(maxsize=8)(make_mc_dropout_eval_step)


@dataclasses.dataclass
class TunedTemperature:
  """`base` (Static or MCDropout) at the softmax temperature in [low, high]
  that minimises its validation loss (`tune_temperature`), tuned once for
  the weights it scores and then used on every split."""

  base: Static | MCDropout
  low: float = 0.5
  high: float = 2.0
  tolerance: float = 0.01
  _tuned: dict = dataclasses.field(default_factory=dict, repr=False)

  def __call__(self, model, params, corpus: Corpus, split: str) -> EvalResult:
    key = (model, id(params))
    if key not in self._tuned:
      at = lambda t: dataclasses.replace(self.base, temperature=t)(model, params, corpus,
                                                                   'valid').loss
      self._tuned = {key: tune_temperature(at, self.low, self.high, self.tolerance)}
      log.info('softmax temperature %.3f minimises the validation loss', self._tuned[key])
    return dataclasses.replace(self.base, temperature=self._tuned[key])(model, params,
                                                                        corpus, split)


@dataclasses.dataclass(frozen=True)
class DynamicEvalSettings:
  """One dynamic-evaluation setting: `rule` 'sgd' or 'rms', the learning
  rate eta, the decay lambda toward the trained weights, RMS's epsilon, the
  segment length and what RMS's mean(MS) is over ('coordinates' as lamb, or
  'tensors' as Krause; `dynamic_rms`)."""
  rule: str
  learning_rate: float
  decay: float
  eps: float
  segment_length: int
  decay_mean: str = 'coordinates'

  def used(self) -> dict[str, Any]:
    """The settings its rule reads (SGD has no epsilon; the learned rule only
    its segment length)."""
    names = {'sgd': ('learning_rate', 'decay', 'segment_length'),
             'rms': ('learning_rate', 'decay', 'eps', 'segment_length', 'decay_mean'),
             'learned': ('segment_length',)}[self.rule]
    return {'rule': self.rule, **{name: getattr(self, name) for name in names}}


@dataclasses.dataclass
class Dynamic:
  """Dynamic evaluation with SGD or RMS steps (`dynamic_evaluate`). Every
  combination of the given values is scored on valid (its first
  `search_tokens` tokens when > 0); the best (diverged settings lose) then
  scores each split from the trained weights. RMS's MS comes from
  `ms_batches` training windows of `ms_batch_size` rows, once per model.
  The result's details hold the chosen settings, the search and each
  segment's NLL sum and token count."""

  bptt: int
  rule: str = 'sgd'
  learning_rate: tuple[float, ...] = (1e-4,)
  decay: tuple[float, ...] = (0.0,)
  eps: tuple[float, ...] = (1e-3,)
  segment_length: tuple[int, ...] = (5,)
  decay_mean: str = 'coordinates'
  ms_batches: int = 100
  ms_batch_size: int = 64
  search_tokens: int = 0
  batch_size: int = 1
  max_tokens: int = 0
  # Shared by copies (dataclasses.replace): MS per model, one transformation
  # per kind of mean(MS), the search per weights.
  _cache: dict = dataclasses.field(default_factory=dict, repr=False)

  def grid(self) -> list[DynamicEvalSettings]:
    return [DynamicEvalSettings(self.rule, lr, decay, eps, int(length), self.decay_mean)
            for lr, decay, eps, length in itertools.product(
                self.learning_rate, self.decay, self.eps if self.rule == 'rms' else (0.0,),
                self.segment_length)]

  def score(self, settings: DynamicEvalSettings, model, params, corpus: Corpus, split: str,
            num_tokens: int = 0) -> EvalResult:
    """`split` (its first `num_tokens` tokens when > 0) scored with
    `settings` from the trained weights; TrainingError when it diverges."""
    stream = _first_tokens(corpus, split, num_tokens)
    # One jitted scan per pass, silent until it ends: say what is running.
    log.info('dynamic evaluation of %s: %s tokens in segments of %d', split,
             f'{len(stream) - 1:,}', settings.segment_length)
    transformation, state = self._transformation(settings, model, params, corpus)
    run = dynamic_evaluate(model, params, transformation, stream, settings.segment_length,
                           self.batch_size, corpus.unit, opt_state=state)
    return dataclasses.replace(run.result, details={
        'settings': dataclasses.asdict(settings), 'segment_nll': run.segment_nll,
        'segment_tokens': run.segment_tokens, 'skipped_updates': run.skipped_updates})

  def __call__(self, model, params, corpus: Corpus, split: str) -> EvalResult:
    best, trials, scored = self._search(model, params, corpus)
    if split == 'valid' and scored is not None:
      result = scored
    else:
      result = self.score(best, model, params, corpus, split, self.max_tokens)
    static = Static(self.bptt, self.batch_size, max_tokens=self.max_tokens)
    return _beside_static(dataclasses.replace(result, details={**result.details,
                                                               'search': trials}),
                          static(model, params, corpus, split))

  def rms_gradients(self, model, params, corpus: Corpus) -> Any:
    """MS of `dynamic_rms` for these weights (`rms_training_gradients`),
    estimated once."""
    key = ('ms', model, id(params))
    if key not in self._cache:
      self._cache[key] = rms_training_gradients(model, params, corpus.train,
                                                self.ms_batch_size, self.bptt,
                                                self.ms_batches)
    return self._cache[key]

  def _search(self, model, params, corpus: Corpus):
    """The chosen settings, every searched setting's validation loss (inf
    where it diverged) and, when the search scored the whole of what valid
    is scored on, the chosen setting's validation result."""
    key = ('search', model, id(params))
    if key in self._cache:
      return self._cache[key]
    grid = self.grid()
    if len(grid) == 1:
      self._cache[key] = grid[0], [], None
      return self._cache[key]
    whole = self.search_tokens in (0, self.max_tokens)
    trials, results, start = [], {}, time.perf_counter()
    for trial, settings in enumerate(grid, 1):
      try:
        results[settings] = self.score(settings, model, params, corpus, 'valid',
                                       self.search_tokens or self.max_tokens)
        loss = results[settings].loss
      except TrainingError as err:
        log.warning('%s: %s', settings, err)
        loss = math.inf
      log.info('search %d/%d: valid loss %.4f (perplexity %.2f) with %s, ETA %s', trial,
               len(grid), loss, math.exp(min(loss, 700)), settings,
               eta(time.perf_counter() - start, trial, len(grid)))
      trials.append((dataclasses.asdict(settings), loss))
    best_index = min(range(len(grid)), key=lambda i: trials[i][1])
    if math.isinf(trials[best_index][1]):
      raise TrainingError('dynamic evaluation diverged with every searched setting: '
                          'lower the learning rates')
    best = grid[best_index]
    self._cache[key] = best, trials, results[best] if whole else None
    return self._cache[key]

  def _transformation(self, settings: DynamicEvalSettings, model, params, corpus: Corpus
                      ) -> tuple[optax.GradientTransformation, Any]:
    """The transformation of `settings` and its initial state. Settings of
    one rule and mean(MS) share one transformation object, their values in
    its state (`optax.inject_hyperparams`), so a search or a tuner compiles
    the scan once per segment length, not once per setting."""
    if settings.rule == 'sgd':
      factory, values = dynamic_sgd, {'learning_rate': settings.learning_rate,
                                      'decay': settings.decay}
    else:
      factory = functools.partial(dynamic_rms,
                                  rms_gradients=self.rms_gradients(model, params, corpus),
                                  decay_mean=settings.decay_mean)
      values = {'learning_rate': settings.learning_rate, 'decay': settings.decay,
                'eps': settings.eps}
    key = ('transformation', settings.rule, settings.decay_mean, model, id(params))
    if key not in self._cache:
      self._cache[key] = optax.inject_hyperparams(factory)(**values)
    injected = self._cache[key]
    # The inner state (theta_g and MS / mean(MS)) does not depend on the values.
    return injected, injected.init(params)._replace(
        hyperparams={k: jnp.asarray(v, jnp.float32) for k, v in values.items()})


@dataclasses.dataclass
class Learned:
  """Dynamic evaluation with the meta-learned update rule (Wolf et al.
  2018), at the segment length it was meta-trained for."""

  meta_learner: MetaLearner
  bptt: int
  batch_size: int = 1
  max_tokens: int = 0

  def __call__(self, model, params, corpus: Corpus, split: str) -> EvalResult:
    learned = self.meta_learner
    stream = _first_tokens(corpus, split, self.max_tokens)
    log.info('dynamic evaluation of %s with the learned rule: %s tokens in segments of %d',
             split, f'{len(stream) - 1:,}', learned.segment_length)
    run = dynamic_evaluate(model, params, learned.transformation, stream,
                           learned.segment_length, self.batch_size, corpus.unit,
                           extra_args={'meta_params': learned.meta_params})
    settings = DynamicEvalSettings('learned', learned.initial_learning_rate, 0.0, 0.0,
                                   learned.segment_length)
    result = dataclasses.replace(run.result, details={
        'settings': dataclasses.asdict(settings), 'search': [],
        'segment_nll': run.segment_nll, 'segment_tokens': run.segment_tokens,
        'skipped_updates': run.skipped_updates})
    static = Static(self.bptt, self.batch_size, max_tokens=self.max_tokens)
    return _beside_static(result, static(model, params, corpus, split))


def _beside_static(result: EvalResult, static: EvalResult) -> EvalResult:
  """A dynamic evaluation's result with the static score of the same tokens
  at the same batch size in its details, the measure of its gain."""
  return dataclasses.replace(result, details={**result.details, 'static_loss': static.loss})


@dataclasses.dataclass
class TokenLosses:
  """Each token's NLL given every token before it, at batch 1 and dropout
  off (`token_losses`), in the result's details; the loss is their mean."""

  bptt: int
  max_tokens: int = 0

  def __call__(self, model, params, corpus: Corpus, split: str) -> EvalResult:
    losses = token_losses(model, params, _first_tokens(corpus, split, self.max_tokens, model),
                          self.bptt)
    return EvalResult(float(np.mean(losses)), len(losses), corpus.unit,
                      details={'token_losses': losses})


def build_evaluator(config: ml_collections.ConfigDict, *, bptt: int, batch_size: int,
                    meta_learner: MetaLearner | None = None) -> Evaluator:
  """The evaluator `config.evaluator` names (`evaluation_config`), windows
  of `bptt` tokens and `batch_size` rows (dynamic evaluation and the learned
  rule: `config.batch_size`, else 1); 'learned' scores with `meta_learner`.

  Raises ConfigError for a name or setting that cannot run, naming the field.
  """
  name = config.evaluator
  if name not in EVALUATORS:
    raise ConfigError(f'unknown evaluator {name!r} (evaluator): choose one of '
                      f'{", ".join(EVALUATORS)}')
  _check_counts(config)
  if name == 'static':
    return Static(bptt, batch_size, _temperature(config.static.temperature, 'static'),
                  config.max_tokens)
  if name == 'mc_dropout':
    return _mc_dropout(config, bptt, batch_size)
  if name == 'temperature':
    cfg = config.temperature
    if cfg.base not in ('static', 'mc_dropout'):
      raise ConfigError(f"temperature.base must be 'static' or 'mc_dropout', got {cfg.base!r}")
    if not 0 < cfg.low < cfg.high or not cfg.tolerance > 0:
      raise ConfigError('temperature: need 0 < low < high and tolerance > 0, got '
                        f'low={cfg.low}, high={cfg.high}, tolerance={cfg.tolerance}')
    base = (Static(bptt, batch_size, max_tokens=config.max_tokens) if cfg.base == 'static'
            else _mc_dropout(config, bptt, batch_size))
    return TunedTemperature(base, cfg.low, cfg.high, cfg.tolerance)
  if name == 'dynamic':
    return _dynamic(config, bptt)
  if name == 'learned':
    if meta_learner is None:
      raise ConfigError('the learned evaluator needs a meta-learner: run lm-zoo-meta-train '
                        'first, or set learned.meta_learner')
    return Learned(meta_learner, bptt, config.batch_size or 1, config.max_tokens)
  return TokenLosses(bptt, config.max_tokens)


def _check_counts(config: ml_collections.ConfigDict) -> None:
  for field in ('batch_size', 'max_tokens'):
    if config[field] < 0:
      raise ConfigError(f'{field} must be >= 0 (0: the default), got {config[field]}')


def _temperature(value: float, section: str) -> float:
  if not (math.isfinite(value) and value > 0):
    raise ConfigError(f'{section}.temperature must be a positive number, got {value}')
  return float(value)


def _mc_dropout(config: ml_collections.ConfigDict, bptt: int, batch_size: int) -> MCDropout:
  cfg = config.mc_dropout
  if cfg.samples < 1:
    raise ConfigError(f'mc_dropout.samples must be at least 1, got {cfg.samples}')
  if not (math.isfinite(cfg.dropout_scale) and cfg.dropout_scale >= 0):
    raise ConfigError(f'mc_dropout.dropout_scale must be >= 0, got {cfg.dropout_scale}')
  return MCDropout(bptt, batch_size, cfg.samples, cfg.dropout_scale, cfg.seed,
                   _temperature(cfg.temperature, 'mc_dropout'), config.max_tokens)


def _dynamic(config: ml_collections.ConfigDict, bptt: int) -> Dynamic:
  cfg = config.dynamic
  if cfg.rule not in RULES:
    raise ConfigError(f'unknown dynamic.rule {cfg.rule!r}: choose one of {", ".join(RULES)}')
  if cfg.decay_mean not in DECAY_MEANS:
    raise ConfigError(f'dynamic.decay_mean must be one of {", ".join(DECAY_MEANS)}, got '
                      f'{cfg.decay_mean!r}')
  for field in ('learning_rate', 'decay', 'eps', 'segment_length'):
    if not cfg[field] or not all(math.isfinite(v) and v >= 0 for v in cfg[field]):
      raise ConfigError(f'dynamic.{field} must be one or more numbers >= 0, got '
                        f'{cfg[field]}')
  if min(cfg.segment_length) < 1 or (cfg.rule == 'rms' and min(cfg.eps) <= 0):
    raise ConfigError('dynamic.segment_length must be >= 1 and dynamic.eps > 0 (rms), got '
                      f'{cfg.segment_length} and {cfg.eps}')
  for field in ('ms_batches', 'ms_batch_size'):
    if cfg[field] < 1:
      raise ConfigError(f'dynamic.{field} must be at least 1, got {cfg[field]}')
  if cfg.search_tokens < 0:
    raise ConfigError(f'dynamic.search_tokens must be >= 0, got {cfg.search_tokens}')
  return Dynamic(bptt, cfg.rule, tuple(cfg.learning_rate), tuple(cfg.decay), tuple(cfg.eps),
                 tuple(int(n) for n in cfg.segment_length), cfg.decay_mean, cfg.ms_batches,
                 cfg.ms_batch_size, cfg.search_tokens, config.batch_size or 1,
                 config.max_tokens)


def split_names(splits) -> tuple[str, ...]:
  """`evaluation.splits` as names; 'valid,test' from a command line counts
  as two."""
  names = tuple(name.strip() for entry in splits for name in entry.split(',') if name.strip())
  unknown = [name for name in names if name not in ('train', 'valid', 'test')]
  if unknown:
    raise ConfigError(f'splits: unknown split {unknown[0]!r}; choose from train, valid, test')
  return names
