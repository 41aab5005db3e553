"""Dynamic evaluation of a work directory, with a small search of its
hyper-parameters on the validation split (`launch/evaluate.py --dyneval`),
and meta-training of the learned update rule on its training split
(`launch/meta_train.py`)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import pathlib
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.optim import (DECAY_MEANS, GateNetwork, NUM_FEATURES, RMSGateNetwork, decay_logits,
                          diagonal_fisher, dynamic_evaluate, dynamic_rms, dynamic_sgd,
                          learned_update_rule, mean_rms, meta_train, rms_training_gradients)
from lm_zoo.training.checkpoints import restore_tree, save_tree
from lm_zoo.training.evaluation import EvalResult
from lm_zoo.training.trained import load_trained
from lm_zoo.training.metrics import eta

log = logging.getLogger(__name__)

METHODS = ('sgd', 'rms', 'learned')
# The hand-designed rule a fresh meta-learner starts as.
PRIORS = ('sgd', 'rms')
META_LEARNER_DIR = 'meta_learner'


@dataclasses.dataclass(frozen=True)
class DynamicEvalSettings:
  """One dynamic-evaluation setting: `method` 'sgd', 'rms' or 'learned', the
  learning rate eta, the decay lambda toward the trained weights, RMS's
  epsilon, the segment length and what RMS's mean(MS) is over ('coordinates'
  as lamb, or 'tensors' as Krause; `dynamic_rms`). The learned rule uses only
  the segment length it was meta-trained with."""
  method: str
  learning_rate: float
  decay: float
  eps: float
  segment_length: int
  decay_mean: str = 'coordinates'


@dataclasses.dataclass
class DynamicEvalReport:
  """The chosen settings, each split's result with them, every searched
  setting's validation loss (inf where it diverged), and per split each
  segment's NLL sum and token count along the stream."""
  settings: DynamicEvalSettings
  results: dict[str, EvalResult]
  trials: list[tuple[DynamicEvalSettings, float]]
  segments: dict[str, tuple[np.ndarray, np.ndarray]]


class DynamicEvaluator:
  """A work directory's best weights, ready to be scored with any dynamic
  evaluation setting of one method: the corpus, the model and, for RMS, the
  mean squared training gradients (estimated once, from `ms_batches` windows
  of `ms_batch_size` rows), or the meta-learned rule for 'learned'. A tuner
  scores many settings with one."""

  def __init__(self, workdir: str | pathlib.Path, method: str = 'rms', batch_size: int = 1,
               ms_batches: int = 100, ms_batch_size: int = 64,
               data_dir: str | None = None):
    if method not in METHODS:
      raise ConfigError(f'unknown dynamic evaluation {method!r}: choose one of '
                        f'{", ".join(METHODS)}')
    self.method, self.batch_size = method, batch_size
    self.config, self.corpus, self.model, self.params = load_trained(workdir, data_dir)
    self.rms, self.learned, self.extra_args = None, None, {}
    self._injected = {}  # decay mean -> the transformation every setting shares
    if method == 'rms':
      self.rms = rms_training_gradients(self.model, self.params, self.corpus.train,
                                        ms_batch_size, self.config.data.bptt, ms_batches)
    elif method == 'learned':
      self.learned, self.extra_args = load_meta_learner(workdir)

  def transformation(self, settings: DynamicEvalSettings
                     ) -> tuple[optax.GradientTransformation, Any]:
    """The transformation of `settings` and its initial state. SGD and RMS
    settings share one transformation object per kind of mean(MS), their
    values in its state (`optax.inject_hyperparams`), so a search or a tuner
    compiles the scan once per segment length, not once per setting."""
    if settings.method == 'learned':
      return self.learned.transformation, None
    factory, values = ((dynamic_sgd, {'learning_rate': settings.learning_rate,
                                      'decay': settings.decay})
                       if settings.method == 'sgd' else
                       (functools.partial(dynamic_rms, rms_gradients=self.rms,
                                          decay_mean=settings.decay_mean),
                        {'learning_rate': settings.learning_rate, 'decay': settings.decay,
                         'eps': settings.eps}))
    if settings.decay_mean not in self._injected:
      self._injected[settings.decay_mean] = optax.inject_hyperparams(factory)(**values)
    injected = self._injected[settings.decay_mean]
    # The inner state (theta_g and MS / mean(MS)) does not depend on the values.
    return injected, injected.init(self.params)._replace(
        hyperparams={k: jnp.asarray(v, jnp.float32) for k, v in values.items()})

  def run(self, settings: DynamicEvalSettings, split: str, num_tokens: int = 0):
    """Scores `split` (its first `num_tokens` tokens when > 0) from the
    trained weights; raises TrainingError when the loss diverges."""
    if settings.method != self.method:
      raise ConfigError(f'this evaluator holds what {self.method!r} needs, not '
                        f'{settings.method!r}')
    stream = self.corpus.split(split)
    stream = stream[:num_tokens + 1] if num_tokens else stream
    # One jitted scan per pass, silent until it ends: say what is running.
    log.info('dynamic evaluation of %s: %s tokens in segments of %d', split,
             f'{len(stream) - 1:,}', settings.segment_length)
    transformation, state = self.transformation(settings)
    return dynamic_evaluate(self.model, self.params, transformation, stream,
                            settings.segment_length, self.batch_size, self.corpus.unit,
                            extra_args=self.extra_args, opt_state=state)


def dynamic_evaluate_workdir(workdir: str | pathlib.Path, method: str = 'rms',
                             learning_rates: Sequence[float] = (1e-4,),
                             decays: Sequence[float] = (0.0,),
                             epsilons: Sequence[float] = (1e-3,),
                             segment_lengths: Sequence[int] = (5,),
                             decay_mean: str = 'coordinates', splits=('valid', 'test'),
                             batch_size: int = 1, ms_batches: int = 100,
                             ms_batch_size: int = 64, search_tokens: int = 0,
                             max_tokens: int = 0, data_dir: str | None = None
                             ) -> DynamicEvalReport:
  """Dynamic evaluation of a work directory's best weights.

  Every combination of the given learning rates, decays, epsilons (RMS only)
  and segment lengths is scored on the validation split; the best one
  (lowest loss; diverged settings lose) then scores every split in `splits`,
  each starting again from the trained weights. With one value each there is
  no search. With `search_tokens` > 0 the search scores only the first that
  many validation tokens (a cheaper search on a large corpus); the chosen
  setting then scores the whole of each split, or its first `max_tokens`
  tokens when that is > 0 (a shorter run on a slow machine: the learned
  rule updates every weight through its gate network, at several times
  the cost of an SGD step). RMS normalises by the root
  mean square of training gradients,
  estimated once from `ms_batches` windows of `ms_batch_size` rows, and
  takes the mean(MS) of its decay rate over `decay_mean` ('coordinates' or
  'tensors', `dynamic_rms`).
  'learned' runs the rule `meta_train_workdir` left in the work directory,
  with its own segment length; the other arguments do not apply to it.
  """
  if decay_mean not in DECAY_MEANS:
    raise ConfigError(f'the decay mean must be over one of {", ".join(DECAY_MEANS)}, got '
                      f'{decay_mean!r}')
  evaluator = DynamicEvaluator(workdir, method, batch_size, ms_batches, ms_batch_size,
                               data_dir)
  if method == 'learned':
    learned = evaluator.learned
    segment_lengths = (learned.segment_length,)
    learning_rates, decays = (learned.initial_learning_rate,), (0.0,)

  def run(settings: DynamicEvalSettings, split: str, num_tokens: int = max_tokens):
    return evaluator.run(settings, split, num_tokens)

  grid = [DynamicEvalSettings(method, lr, decay, eps, length, decay_mean)
          for lr, decay, eps, length in itertools.product(
              learning_rates, decays, epsilons if method == 'rms' else (0.0,),
              segment_lengths)]
  trials, valid = [], {}
  if len(grid) == 1:
    best = grid[0]
  else:
    search_start = time.perf_counter()
    for trial, settings in enumerate(grid, 1):
      try:
        valid[settings] = run(settings, 'valid', search_tokens or max_tokens)
        loss = valid[settings].result.loss
      except TrainingError as err:
        log.warning('%s: %s', settings, err)
        loss = math.inf
      log.info('search %d/%d: valid loss %.4f (perplexity %.2f) with %s, ETA %s', trial,
               len(grid), loss, math.exp(min(loss, 700)), settings,
               eta(time.perf_counter() - search_start, trial, len(grid)))
      trials.append((settings, loss))
    best, best_loss = min(trials, key=lambda trial: trial[1])
    if math.isinf(best_loss):
      raise TrainingError('dynamic evaluation diverged with every searched setting: '
                          'lower the learning rates')
  searched_all = search_tokens in (0, max_tokens)
  runs = {split: valid[best] if split == 'valid' and best in valid and searched_all
          else run(best, split) for split in splits}
  return DynamicEvalReport(best, {split: r.result for split, r in runs.items()}, trials,
                           {split: (r.segment_nll, r.segment_tokens)
                            for split, r in runs.items()})


@dataclasses.dataclass
class MetaLearner:
  """A meta-trained update rule: its transformation (theta_0's precision
  inside), meta-parameters and the segment length it was trained for."""
  transformation: optax.GradientTransformationExtraArgs
  meta_params: Any
  segment_length: int
  initial_learning_rate: float


def meta_train_workdir(workdir: str | pathlib.Path, meta_steps: int = 300,
                       num_updates: int = 40, segment_length: int = 5,
                       batch_size: int = 4, hidden: int = 16,
                       initial_learning_rate: float = 0.03, initial_decay: float = 0.0067,
                       meta_learning_rate: float = 1e-3,
                       fisher_batches: int = 100, fisher_batch_size: int = 64,
                       first_order: bool = False, seed: int = 0,
                       data_dir: str | None = None, log_every: int = 50,
                       prior: str = 'sgd', initial_eps: float = 1e-3,
                       carry_over: bool = False,
                       decay_mean: str = 'coordinates') -> np.ndarray:
  """Meta-trains the learned update rule (Wolf et al. 2018) for a work
  directory's best weights on its training split, and saves it to
  `workdir/meta_learner` for `dynamic_evaluate_workdir(method='learned')`.

  theta_0's precision is the diagonal Fisher from `fisher_batches` training
  windows of `fisher_batch_size` rows. The gate network (`hidden` units)
  starts as the `prior` rule: 'sgd', SGD with step `initial_learning_rate`
  and a decay toward theta_0 of `initial_decay` per update (`GateNetwork`,
  `decay_logits`), or 'rms', RMS dynamic evaluation with that learning rate,
  decay and `initial_eps`, its MS the square root of the Fisher and its
  mean(MS) over `decay_mean` (`RMSGateNetwork`). Each of `meta_steps` Adam steps (`meta_learning_rate`)
  backpropagates through `num_updates` updates of `segment_length` tokens at
  `batch_size` stream positions, from the trained weights at random
  positions or, with `carry_over`, continuing along the stream
  (`meta_train`). Returns L_meta / K per meta-step.
  """
  if prior not in PRIORS:
    raise ConfigError(f'prior must be one of {", ".join(PRIORS)}, got {prior!r}')
  if decay_mean not in DECAY_MEANS:
    raise ConfigError(f'the decay mean must be over one of {", ".join(DECAY_MEANS)}, got '
                      f'{decay_mean!r}')
  config, corpus, model, params = load_trained(workdir, data_dir)
  precision = diagonal_fisher(model, params, corpus.train, fisher_batch_size,
                              config.data.bptt, fisher_batches)
  meta = {'prior': prior, 'hidden': hidden, 'initial_learning_rate': initial_learning_rate,
          'initial_decay': initial_decay, 'initial_eps': initial_eps}
  if prior == 'rms':
    meta.update(mean_ms=mean_rms(precision, decay_mean), decay_mean=decay_mean,
                decay_clip='rate')
  net = _gate_network(meta)
  meta_params = net.init(jax.random.key(seed), jnp.zeros((1, NUM_FEATURES)))
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(meta_learning_rate))
  result = meta_train(model, net.apply, meta_params, params, precision, corpus.train,
                      meta_steps, num_updates, segment_length, batch_size, optimizer, seed,
                      first_order=first_order, log_every=log_every, carry_over=carry_over)
  save_tree(pathlib.Path(workdir) / META_LEARNER_DIR,
            {'meta_params': result.meta_params, 'precision': precision},
            {**meta, 'segment_length': segment_length, 'num_updates': num_updates,
             'batch_size': batch_size, 'meta_steps': meta_steps,
             'meta_learning_rate': meta_learning_rate, 'first_order': first_order,
             'carry_over': carry_over, 'seed': seed,
             'losses': [float(x) for x in result.losses]})
  return result.losses


def _gate_network(meta: dict[str, Any]):
  """The gate network a saved meta-learner's description names. Meta-learners
  saved before priors existed start as SGD; RMS priors saved before the decay
  rate was corrected keep the rate they were meta-trained with ('ratio')."""
  if meta.get('prior', 'sgd') == 'rms':
    return RMSGateNetwork(learning_rate=meta['initial_learning_rate'],
                          decay=meta['initial_decay'], eps=meta['initial_eps'],
                          mean_ms=meta['mean_ms'], hidden=meta['hidden'],
                          decay_clip=meta.get('decay_clip', 'ratio'))
  return GateNetwork(hidden=meta['hidden'], learning_rate=meta['initial_learning_rate'],
                     **decay_logits(meta.get('initial_decay', 0.0067)))


def load_meta_learner(workdir: str | pathlib.Path) -> tuple[MetaLearner, dict[str, Any]]:
  """The learned rule `meta_train_workdir` saved, and the extra arguments
  its updates take."""
  saved = restore_tree(pathlib.Path(workdir) / META_LEARNER_DIR)
  if saved is None:
    raise ConfigError(f'no meta-learner in {workdir}/{META_LEARNER_DIR}: run '
                      f'launch/meta_train.py --workdir={workdir} first')
  tree, meta = saved
  learned = MetaLearner(learned_update_rule(_gate_network(meta).apply, tree['precision']),
                        tree['meta_params'], meta['segment_length'],
                        meta['initial_learning_rate'])
  return learned, {'meta_params': tree['meta_params']}
