"""The evaluators that adapt the weights along the stream: dynamic
evaluation with SGD or RMS steps, searched on valid (`Dynamic`), and the
meta-learned rule (`Learned`). Both follow `lm_zoo.evaluation.evaluators`'
prepare-then-score form."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from typing import Any, Sequence

from lm_zoo.data import Corpus
from lm_zoo.errors import ConfigError, TrainingError, is_whole_number
from lm_zoo.evaluation.checks import check_grid, check_whole, check_windows, is_number
from lm_zoo.evaluation.dynamic import (
  DynamicEvalResult,
  DynamicMember,
  dynamic_evaluate,
  dynamic_evaluate_many,
)
from lm_zoo.evaluation.dynamic_choice import DynamicChoice, DynamicEvalSettings, DynamicSetup
from lm_zoo.evaluation.dynamic_rules import DYNAMIC_RULES, SEARCHED
from lm_zoo.evaluation.evaluators import (
  Evaluator,
  Prepared,
  Static,
  beside_static,
  check_members,
  first_tokens,
  one_model_and_corpus,
)
from lm_zoo.evaluation.meta_training import MetaLearner
from lm_zoo.evaluation.results import EvalResult, perplexity
from lm_zoo.evaluation.statistics import rms_training_gradients
from lm_zoo.optim import DECAY_MEANS

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Dynamic(Evaluator):
  """Dynamic evaluation with a registered rule's steps (`DYNAMIC_RULES`:
  SGD, RMS, or one of your own; `dynamic_evaluate`). `prepare`
  scores every combination of the given values on valid (its first
  `search_tokens` tokens when > 0) and keeps the best (diverged settings
  lose); `score` then scores a split with it from the trained weights.
  MS, for a rule that reads it, comes from `ms_batches` training windows of
  `ms_batch_size` rows.
  The result's details hold the chosen settings, the search, each segment's
  NLL sum and token count, and the static loss of the same tokens.
  `members` runs (settings, and with `prepare_many` / `score_many` several
  weights) share one compiled scan at a time, vmapped (0: all;
  `dynamic_evaluate_many`), and so many weights' static baselines one pass
  (`Static.score_many`)."""

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
  members: int = 1

  def __post_init__(self):
    check_windows(self.bptt, self.batch_size, self.max_tokens)
    if self.rule not in DYNAMIC_RULES:
      raise ConfigError(f'rule {self.rule!r} is unknown: choose one of {", ".join(DYNAMIC_RULES)}')
    if self.decay_mean not in DECAY_MEANS:
      raise ConfigError(
        f'decay_mean must be one of {", ".join(DECAY_MEANS)}, got {self.decay_mean!r}'
      )
    for name in SEARCHED + ('segment_length',):
      check_grid(getattr(self, name), name)
    if not all(is_whole_number(n) and n >= 1 for n in self.segment_length):
      raise ConfigError(
        f'segment_length must be whole numbers >= 1, got {tuple(self.segment_length)}'
      )
    for name in DYNAMIC_RULES[self.rule].positive:
      if min(getattr(self, name)) <= 0:
        raise ConfigError(
          f'{name} must be > 0 for rule {self.rule!r}, got {tuple(getattr(self, name))}'
        )
    check_whole(self.ms_batches, 'ms_batches', 1)
    check_whole(self.ms_batch_size, 'ms_batch_size', 1)
    check_whole(self.search_tokens, 'search_tokens', 0)
    check_members(self.members)

  def grid(self) -> list[DynamicEvalSettings]:
    read = DYNAMIC_RULES[self.rule].hyperparameters
    searched = [getattr(self, name) if name in read else (0.0,) for name in SEARCHED]
    return [
      DynamicEvalSettings(self.rule, lr, decay, eps, int(length), self.decay_mean)
      for lr, decay, eps, length in itertools.product(*searched, self.segment_length)
    ]

  def setup(self, model, params, corpus: Corpus) -> DynamicSetup:
    """What every setting shares for these weights (MS estimated here for a
    rule that reads it)."""
    if DYNAMIC_RULES[self.rule].statistics and len(corpus.train) - 1 < self.ms_batch_size:
      raise ConfigError(
        f'ms_batch_size {self.ms_batch_size:,} is more rows than the train split has tokens '
        f'({len(corpus.train) - 1:,}): lower dynamic.ms_batch_size'
      )
    ms = (
      rms_training_gradients(
        model, params, corpus.train, self.ms_batch_size, self.bptt, self.ms_batches
      )
      if DYNAMIC_RULES[self.rule].statistics
      else None
    )
    return DynamicSetup(ms)

  def score_settings_many(
    self, runs: Sequence[tuple], model, corpus: Corpus, split: str, num_tokens: int = 0
  ) -> list[EvalResult | TrainingError]:
    """`split` (its first `num_tokens` tokens when > 0) scored by each of
    `runs`, (setup, settings, trained weights) triples: `members` of them at
    a time in one vmapped scan (`dynamic_evaluate_many`). Returns, in their
    order, each one's result or the TrainingError of its divergence."""
    stream = first_tokens(corpus, split, num_tokens, rows=self.batch_size)
    outcomes: list = [None] * len(runs)
    by_length: dict[int, list[int]] = {}
    for i, (_, settings, _) in enumerate(runs):
      by_length.setdefault(settings.segment_length, []).append(i)
    for length, ids in by_length.items():
      # One jitted scan per pass, silent until it ends: say what is running.
      log.info(
        'dynamic evaluation of %s: %s tokens in segments of %d, %d run(s), %s at once',
        split,
        f'{len(stream) - 1:,}',
        length,
        len(ids),
        self.members or 'all',
      )
      members = []
      for setup, settings, params in (runs[i] for i in ids):
        members.append(DynamicMember(params, *setup.transformation(settings, params)))
      scored = dynamic_evaluate_many(
        model, members, stream, length, self.batch_size, corpus.unit, max_members=self.members
      )
      for i, run in zip(ids, scored):
        outcomes[i] = run if isinstance(run, TrainingError) else _with_details(run, runs[i][1])
    return outcomes

  def score_settings(
    self,
    setup: DynamicSetup,
    settings: DynamicEvalSettings,
    model,
    params,
    corpus: Corpus,
    split: str,
    num_tokens: int = 0,
  ) -> EvalResult:
    """`score_settings_many` of one run; TrainingError when it diverges."""
    return _raised(
      self.score_settings_many([(setup, settings, params)], model, corpus, split, num_tokens)[0]
    )

  def prepare_many(self, model, params_list: Sequence, corpus: Corpus) -> list:
    """Each weights' search, all of them (every setting of every weights)
    scored together `members` at a time."""
    setups = [self.setup(model, params, corpus) for params in params_list]
    grid = self.grid()
    if len(grid) == 1:
      return [
        Prepared(model, params, corpus, DynamicChoice(grid[0], setup=setup))
        for params, setup in zip(params_list, setups)
      ]
    whole = self.search_tokens in (0, self.max_tokens)
    runs = [(setup, settings, p) for p, setup in zip(params_list, setups) for settings in grid]
    scored = self.score_settings_many(
      runs, model, corpus, 'valid', self.search_tokens or self.max_tokens
    )
    prepared = []
    for k, (params, setup) in enumerate(zip(params_list, setups)):
      outcomes = scored[k * len(grid) : (k + 1) * len(grid)]
      which = f' (weights {k + 1} of {len(params_list)})' if len(params_list) > 1 else ''
      trials = []
      for settings, outcome in zip(grid, outcomes):
        if isinstance(outcome, TrainingError):
          log.warning('%s%s: %s', settings, which, outcome)
        loss = math.inf if isinstance(outcome, TrainingError) else outcome.loss
        log.info(
          'search%s: valid loss %.4f (perplexity %.2f) with %s',
          which,
          loss,
          perplexity(loss),
          settings,
        )
        trials.append((dataclasses.asdict(settings), loss))
      best = min(range(len(grid)), key=lambda i: trials[i][1])
      if math.isinf(trials[best][1]):
        prepared.append(
          TrainingError(
            'dynamic evaluation diverged with every searched setting: lower the learning rates'
          )
        )
        continue
      valid = outcomes[best] if whole else None
      prepared.append(
        Prepared(model, params, corpus, DynamicChoice(grid[best], trials, valid, setup))
      )
    return prepared

  def prepare(self, model, params, corpus: Corpus) -> Prepared:
    return _raised(self.prepare_many(model, [params], corpus)[0])

  def choice_record(self, prepared: Prepared) -> dict[str, Any]:
    """The chosen setting, the search and the chosen setting's valid result
    (None where the search scored part of valid)."""
    choice = prepared.choice
    return {
      'settings': dataclasses.asdict(choice.settings),
      'trials': choice.trials,
      'valid': None if choice.valid is None else choice.valid.to_record(),
    }

  def prepare_from(self, model, params, corpus: Corpus, record: Any) -> Prepared:
    """The choice `choice_record` gave, with MS estimated again (a few
    training windows) rather than the search run again."""
    if record is None:
      return self.prepare(model, params, corpus)
    grid, settings = self.grid(), DynamicEvalSettings(**record['settings'])
    trials = [tuple(trial) for trial in record['trials']]
    searched = [DynamicEvalSettings(**trial[0]) for trial in trials]
    numbers = all(is_number(trial[1]) for trial in trials)
    if settings not in grid or searched != (grid if len(grid) > 1 else []) or not numbers:
      raise ValueError(f'not a choice among the settings {grid}: {settings}, {trials}')
    valid = None if record['valid'] is None else EvalResult.from_record(record['valid'])
    choice = DynamicChoice(settings, trials, valid, self.setup(model, params, corpus))
    return Prepared(model, params, corpus, choice)

  def _score_ready(self, prepared: Sequence[Prepared], split: str) -> list:
    """Each prepared weights' `split` scored with its chosen setting, all
    of them together `members` at a time; they share one model and corpus."""
    if not prepared:
      return []
    model, corpus = one_model_and_corpus(prepared)
    reuse = [split == 'valid' and p.choice.valid is not None for p in prepared]
    runs = [(p.choice.setup, p.choice.settings, p.params) for p, r in zip(prepared, reuse) if not r]
    scored = iter(
      self.score_settings_many(runs, model, corpus, split, self.max_tokens) if runs else []
    )
    outcomes = [p.choice.valid if reused else next(scored) for p, reused in zip(prepared, reuse)]
    kept = [i for i, result in enumerate(outcomes) if not isinstance(result, TrainingError)]
    # The baseline of the same tokens, as many weights at a time as the runs.
    static = Static(self.bptt, self.batch_size, max_tokens=self.max_tokens, members=self.members)
    for i, baseline in zip(kept, static.score_many([prepared[i] for i in kept], split)):
      details = {**outcomes[i].details, 'search': prepared[i].choice.trials}
      outcomes[i] = beside_static(dataclasses.replace(outcomes[i], details=details), baseline)
    return outcomes

  def score(self, prepared: Prepared, split: str) -> EvalResult:
    return _raised(self.score_many([prepared], split)[0])


def _with_details(run: DynamicEvalResult, settings: DynamicEvalSettings) -> EvalResult:
  return dataclasses.replace(
    run.result,
    details={
      'settings': dataclasses.asdict(settings),
      'segment_nll': run.segment_nll,
      'segment_tokens': run.segment_tokens,
      'skipped_updates': run.skipped_updates,
    },
  )


def _raised(outcome):
  """`outcome`, raised where it is the error of its divergence."""
  if isinstance(outcome, TrainingError):
    raise outcome
  return outcome


@dataclasses.dataclass(frozen=True)
class Learned(Evaluator):
  """Dynamic evaluation with the meta-learned update rule (Wolf et al.
  2018), at the segment length it was meta-trained for."""

  meta_learner: MetaLearner
  bptt: int
  batch_size: int = 1
  max_tokens: int = 0

  def __post_init__(self):
    check_windows(self.bptt, self.batch_size, self.max_tokens)

  def score(self, prepared: Prepared, split: str) -> EvalResult:
    learned = self.meta_learner
    stream = first_tokens(prepared.corpus, split, self.max_tokens, rows=self.batch_size)
    log.info(
      'dynamic evaluation of %s with the learned rule: %s tokens in segments of %d',
      split,
      f'{len(stream) - 1:,}',
      learned.segment_length,
    )
    run = dynamic_evaluate(
      prepared.model,
      prepared.params,
      learned.transformation,
      stream,
      learned.segment_length,
      self.batch_size,
      prepared.corpus.unit,
      extra_args={'meta_params': learned.meta_params},
    )
    settings = DynamicEvalSettings(
      'learned', learned.initial_learning_rate, 0.0, 0.0, learned.segment_length
    )
    result = dataclasses.replace(
      run.result,
      details={
        'settings': dataclasses.asdict(settings),
        'search': [],
        'segment_nll': run.segment_nll,
        'segment_tokens': run.segment_tokens,
        'skipped_updates': run.skipped_updates,
      },
    )
    static = Static(self.bptt, self.batch_size, max_tokens=self.max_tokens)
    return beside_static(result, static.score(prepared, split))
