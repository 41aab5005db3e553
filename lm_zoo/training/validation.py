"""The loop's turns that read the seeds' scores (lm_zoo/training/loop.py): a
log line of the training losses, a validation turn (every seed scored, its
best weights kept), an epoch's end, and averaging switched on, seed by seed."""

from __future__ import annotations

import logging
import math

import numpy as np

from lm_zoo.evaluation import EvalResult, evaluate_stream_stacked, mean_and_spread, perplexity
from lm_zoo.optim import averaging_state, start_averaging
from lm_zoo.runs.nonfinite import RollBack
from lm_zoo.training.averaging import patience_reached, should_start_averaging
from lm_zoo.training.run import Run, Trainer
from lm_zoo.training.scoring import eval_batch_size, score_split
from lm_zoo.training.seed_axis import select_seeds, take_seed

log = logging.getLogger(__name__)


def _column_means(values: np.ndarray) -> np.ndarray:
  """Each column's mean over its finite entries (nan for none)."""
  finite = np.isfinite(values)
  counts = finite.sum(axis=0)
  sums = np.where(finite, values, 0.0).sum(axis=0)
  return np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)


def log_training(t: Trainer, run: Run, rates: np.ndarray) -> RollBack | None:
  """Logs and records each seed's mean loss and gradient norm over the
  updates since the last line."""
  fetched = run.updates.fetch(run.progress)
  if fetched.rollback is not None:
    return fetched.rollback
  losses, norms = _column_means(fetched.losses), _column_means(fetched.grad_norms)
  rate, total = run.throughput.rate(), t.total_steps
  epoch, step = run.progress.epoch, run.step
  if t.num_seeds == 1:
    log.info(
      'epoch %d step %d/%d (%.0f%%)  loss %.4f  ppl %.2f  grad norm %.3g  lr %.4g  '
      '%.0f tokens/s  ETA %s',
      epoch,
      step,
      total,
      100 * step / total,
      losses[0],
      perplexity(losses[0]),
      norms[0],
      rates[0],
      rate,
      run.throughput.eta(total - step),
    )
  else:
    log.info(
      'epoch %d step %d/%d (%.0f%%)  loss %.4f (seeds %.4f to %.4f)  grad norm %.3g  '
      'lr %.4g  %.0f tokens/s (all seeds)  ETA %s',
      epoch,
      step,
      total,
      100 * step / total,
      losses.mean(),
      losses.min(),
      losses.max(),
      norms.mean(),
      rates.mean(),
      rate,
      run.throughput.eta(total - step),
    )
  for k in range(t.num_seeds):
    loss = float(losses[k])
    t.metrics.write(
      'train',
      step=step,
      epoch=epoch,
      **t.seed_fields(k),
      loss=loss,
      perplexity=perplexity(loss),
      grad_norm=float(norms[k]),
      learning_rate=float(rates[k]),
      tokens_per_second=rate,
    )
  run.throughput.reset()
  return None


def averaging_flags(t: Trainer, run: Run) -> np.ndarray:
  """Whether each seed's weights are being averaged."""
  state = averaging_state(run.state.opt_state)
  if state is None:
    return np.zeros(t.num_seeds, bool)
  return np.asarray(state.averaging, bool).reshape(t.num_seeds)


def scored_params(run: Run, averaged: np.ndarray):
  """The weights validation scores: each seed's average once it started."""
  if not averaged.any():
    return run.state.params
  return select_seeds(averaged, averaging_state(run.state.opt_state).average, run.state.params)


def score_seeds(t: Trainer, params) -> list[EvalResult]:
  """Every seed's `params` scored on the valid split, at once when several."""
  if t.num_seeds == 1:
    return [score_split(t, 'valid', take_seed(params, 0))]
  batch_size = eval_batch_size(t.config, 'valid')
  return evaluate_stream_stacked(
    t.stacked_eval_step,
    params,
    t.model.initialize_carry(batch_size),
    t.corpus.valid,
    batch_size,
    t.config.data.bptt,
    t.corpus.unit,
    what='valid evaluation',
  )


def validate(t: Trainer, run: Run, what: str) -> tuple[list[EvalResult], np.ndarray]:
  """One validation turn: scores each seed's weights evaluation uses
  (averaged ones once its averaging started), keeps them when they are its
  best so far, tells on_validation, and starts averaging when the patience
  trigger says so. Returns the results and whether each seed's weights
  scored were averaged."""
  progress = run.progress
  averaged = averaging_flags(t, run)
  params = scored_params(run, averaged)
  results = score_seeds(t, params)
  if t.num_seeds == 1:
    log.info(
      '%s: valid %s%s', what, results[0].summary(), ' (averaged weights)' if averaged[0] else ''
    )
  else:
    log.info('%s: valid %s', what, spread(results))
  for k, result in enumerate(results):
    t.metrics.write(
      'valid',
      step=run.step,
      epoch=progress.epoch,
      **t.seed_fields(k),
      averaged=bool(averaged[k]),
      **result.as_dict(),
    )
    if result.loss < progress.best_valid[k]:
      progress.best_valid[k], progress.best_step[k] = result.loss, run.step
      t.best[k].save_best(
        run.step, take_seed(params, k), {'epoch': progress.epoch, 'valid_loss': result.loss}
      )
    if t.on_validation is not None:
      t.on_validation(run.step, progress.epoch, result)
    if not averaged[k] and patience_reached(t.config.averaging, run.step, progress.best_step[k]):
      average_from_now(t, run, k, f'step {run.step}')
  return results, averaged


def average_from_now(t: Trainer, run: Run, k: int, when: str) -> None:
  """Switches on seed `k`'s parameter averaging."""
  run.state = run.state.replace(opt_state=start_averaging(run.state.opt_state, k))
  log.info(
    '%s%s: averaging the weights from now on (%s trigger)',
    f'seed {t.configs[k].seed}, ' if t.num_seeds > 1 else '',
    when,
    t.config.averaging.trigger,
  )


def end_epoch(t: Trainer, run: Run) -> None:
  """Validates, starts each seed's averaging when the epoch trigger says so,
  and moves on to the next epoch."""
  progress = run.progress
  results, averaged = validate(t, run, f'epoch {progress.epoch} done')
  for k, result in enumerate(results):
    if not averaged[k] and should_start_averaging(
      t.config.averaging,
      result.loss,
      progress.valid_losses[k],
      progress.epoch,
      t.config.train.num_epochs,
    ):
      average_from_now(t, run, k, f'epoch {progress.epoch}')
    progress.valid_losses[k].append(result.loss)
  progress.epoch += 1
  progress.position = 0


def spread(results: list[EvalResult]) -> str:
  """'perplexity 86.52 ± 0.45 (seeds: 86.20, 86.84)': the mean and sample
  standard deviation over the seeds (nan for one)."""
  values = [result.figure for result in results]
  mean, std = mean_and_spread(values)
  return (
    f'{results[0].measure} {mean:.2f} ± {std:.2f} (seeds: {", ".join(f"{v:.2f}" for v in values)})'
  )
