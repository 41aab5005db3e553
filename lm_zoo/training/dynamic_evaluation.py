"""Dynamic evaluation of a work directory, with a small search of its
hyper-parameters on the validation split (`launch/evaluate.py --dyneval`)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import pathlib
from typing import Sequence

from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.optim import DECAY_CLIPS, dynamic_evaluate, dynamic_rms, dynamic_sgd
from lm_zoo.optim import rms_training_gradients
from lm_zoo.training.evaluation import EvalResult
from lm_zoo.training.loop import load_trained

log = logging.getLogger(__name__)

METHODS = ('sgd', 'rms')


@dataclasses.dataclass(frozen=True)
class DynamicEvalSettings:
  """One dynamic-evaluation setting: `method` 'sgd' or 'rms', the learning
  rate eta, the decay lambda toward the trained weights, RMS's epsilon, the
  segment length and the decay clip ('lamb' or 'krause', RMS only)."""
  method: str
  learning_rate: float
  decay: float
  eps: float
  segment_length: int
  decay_clip: str = 'lamb'


@dataclasses.dataclass
class DynamicEvalReport:
  """The chosen settings, each split's result with them, and every searched
  setting's validation loss (inf where it diverged)."""
  settings: DynamicEvalSettings
  results: dict[str, EvalResult]
  trials: list[tuple[DynamicEvalSettings, float]]


def dynamic_evaluate_workdir(workdir: str | pathlib.Path, method: str = 'rms',
                             learning_rates: Sequence[float] = (1e-4,),
                             decays: Sequence[float] = (0.0,),
                             epsilons: Sequence[float] = (1e-3,),
                             segment_lengths: Sequence[int] = (5,),
                             decay_clip: str = 'lamb', splits=('valid', 'test'),
                             batch_size: int = 1, ms_batches: int = 100,
                             ms_batch_size: int = 64, data_dir: str | None = None
                             ) -> DynamicEvalReport:
  """Dynamic evaluation of a work directory's best weights.

  Every combination of the given learning rates, decays, epsilons (RMS only)
  and segment lengths is scored on the validation split; the best one
  (lowest loss; diverged settings lose) then scores every split in `splits`,
  each starting again from the trained weights. With one value each there is
  no search. RMS normalises by the root mean square of training gradients,
  estimated once from `ms_batches` windows of `ms_batch_size` rows.
  """
  if method not in METHODS:
    raise ConfigError(f'unknown dynamic evaluation {method!r}: choose sgd or rms')
  if decay_clip not in DECAY_CLIPS:
    raise ConfigError(f'decay clip must be one of {", ".join(DECAY_CLIPS)}, got '
                      f'{decay_clip!r}')
  config, corpus, model, params = load_trained(workdir, data_dir)
  rms = None
  if method == 'rms':
    rms = rms_training_gradients(model, params, corpus.train, ms_batch_size,
                                 config.data.bptt, ms_batches)

  def run(settings: DynamicEvalSettings, split: str) -> EvalResult:
    if settings.method == 'sgd':
      transformation = dynamic_sgd(settings.learning_rate, settings.decay)
    else:
      transformation = dynamic_rms(settings.learning_rate, settings.decay, settings.eps,
                                   rms, settings.decay_clip)
    return dynamic_evaluate(model, params, transformation, corpus.split(split),
                            settings.segment_length, batch_size, corpus.unit).result

  grid = [DynamicEvalSettings(method, lr, decay, eps, length, decay_clip)
          for lr, decay, eps, length in itertools.product(
              learning_rates, decays, epsilons if method == 'rms' else (0.0,),
              segment_lengths)]
  trials, valid = [], {}
  if len(grid) == 1:
    best = grid[0]
  else:
    for settings in grid:
      try:
        valid[settings] = run(settings, 'valid')
        loss = valid[settings].loss
      except TrainingError as err:
        log.warning('%s: %s', settings, err)
        loss = math.inf
      log.info('valid loss %.4f (perplexity %.2f) with %s', loss, math.exp(min(loss, 700)),
               settings)
      trials.append((settings, loss))
    best, best_loss = min(trials, key=lambda trial: trial[1])
    if math.isinf(best_loss):
      raise TrainingError('dynamic evaluation diverged with every searched setting: '
                          'lower the learning rates')
  results = {split: valid[best] if split == 'valid' and best in valid else run(best, split)
             for split in splits}
  return DynamicEvalReport(best, results, trials)
