"""The last phase of a run, `finish`: each seed's best weights scored on the
final splits, text sampled from them, and the summaries (summary.json, and
the lines logged). A run of several seeds writes each seed's summary to
WORKDIR/seed_S/summary.json and, in WORKDIR/summary.json, each split's mean
and spread over the seeds."""

from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Any, Sequence

import jax

from lm_zoo.evaluation import EvalResult, mean_and_spread
from lm_zoo.progress import format_duration
from lm_zoo.runs.files import SUMMARY_FILE, is_main_process, write_text_atomically
from lm_zoo.runtime import environment
from lm_zoo.training.run import Run, Trainer
from lm_zoo.training.scoring import final_batch_size, final_scores, record_samples
from lm_zoo.training.seed_axis import seed_dir, take_seed
from lm_zoo.training.validation import spread

log = logging.getLogger(__name__)


def finish(t: Trainer, run: Run, final_splits: Sequence[str]) -> dict[str, Any]:
  """Scores each seed's best weights on `final_splits`, samples text from
  them, and writes the summaries; returns the run's."""
  seconds = run.seconds_trained()  # the whole run's, over the processes it was resumed by
  summaries = [seed_summary(t, run, k, final_splits, seconds) for k in range(t.num_seeds)]
  wall_seconds = round(time.perf_counter() - t.started, 1)
  for summary in summaries:
    summary['wall_seconds'] = wall_seconds
  if t.num_seeds == 1:
    _write(t.workdir, summaries[0])
    return summaries[0]
  for summary in summaries:
    folder = seed_dir(t.workdir, summary['seed'])
    _write(folder, summary)
    log.info('seed %d: %s', summary['seed'], run_summary(summary, folder).replace('\n', ';'))
  summary: dict[str, Any] = {
    'step': run.step,
    'seeds': [c.seed for c in t.configs],
    'train_seconds': round(seconds, 1),
    'tokens_per_second': round(run.all_tokens_trained() / max(seconds, 1e-9), 1),
    'num_params': summaries[0]['num_params'],
    'unit': t.corpus.unit,
    'runs': summaries,
    'environment': environment(),
    'wall_seconds': wall_seconds,
  }
  for split in final_splits:
    results = [
      EvalResult(s[split]['loss'], s[split]['num_tokens'], t.corpus.unit) for s in summaries
    ]
    mean, std = mean_and_spread([result.figure for result in results])
    summary[split] = {'mean': mean, 'std': std, 'measure': results[0].measure}
    log.info('%s over %d seeds: %s', split, len(results), spread(results))
  if is_main_process():
    write_text_atomically(t.workdir / SUMMARY_FILE, json.dumps(summary, indent=2))
  return summary


def _write(folder: pathlib.Path, summary: dict[str, Any]) -> None:
  if is_main_process():
    write_text_atomically(folder / SUMMARY_FILE, json.dumps(summary, indent=2))
  if 'seed' not in summary:
    log.info('%s', run_summary(summary, folder))


def seed_summary(
  t: Trainer, run: Run, k: int, final_splits: Sequence[str], seconds: float
) -> dict[str, Any]:
  """Seed `k`'s summary: its best weights scored on `final_splits` and
  sampled from; the last ones (`best_epoch` None) where no validation turn
  kept best weights."""
  seeded, several = t.configs[k], t.num_seeds > 1
  params = take_seed(run.state.params, k)
  best = t.best[k].restore_best(params)
  params, best_meta = best if best is not None else (params, {'epoch': None})
  summary: dict[str, Any] = {'seed': seeded.seed} if several else {}
  summary.update(
    {
      'step': run.step,
      'best_epoch': best_meta['epoch'],
      'train_seconds': round(seconds, 1),
      'tokens_per_second': round(run.all_tokens_trained() / t.num_seeds / max(seconds, 1e-9), 1),
      'num_params': int(sum(x.size for x in jax.tree.leaves(params))),
      'unit': t.corpus.unit,
      'skipped_updates': run.progress.skipped_updates[k],
      'rollbacks': run.progress.rollbacks[k],
    }
  )
  if several:
    summary['valid_curve'] = [
      EvalResult(loss, 0, t.corpus.unit).figure for loss in run.progress.valid_losses[k]
    ]
  summary['environment'] = environment()
  folder = seed_dir(t.workdir, seeded.seed) if several else t.workdir
  for split, result in final_scores(
    seeded, folder, t.model, t.corpus, params, final_splits
  ).items():
    if not several:
      log.info(
        '%s %s (%d tokens, batch %d)',
        split,
        result.summary(),
        result.num_tokens,
        final_batch_size(seeded, split),
      )
    t.metrics.write(split, step=run.step, **t.seed_fields(k), final=True, **result.as_dict())
    summary[split] = result.as_dict()
  if seeded.generate.num_lines > 0:  # what the seed's run alone samples
    tags = (
      {'tag': f'seed_{seeded.seed}/samples', 'label': f'seed {seeded.seed} sample'}
      if several
      else {}
    )
    summary['samples'] = record_samples(
      t.model, params, t.corpus, seeded, t.metrics, run.step, **tags
    )
  return summary


def count_params(state) -> int:
  """The parameters of one seed of a train state with the seed axis."""
  return int(sum(x.size // x.shape[0] for x in jax.tree.leaves(state.params)))


def run_summary(summary: dict[str, Any], workdir: pathlib.Path) -> str:
  """The lines printed when a run ends: its scores, time and speed."""
  scores = '  '.join(
    f'{split} {EvalResult(summary[split]["loss"], 0, summary["unit"]).summary()}'
    for split in ('valid', 'test')
    if split in summary
  )
  best = summary['best_epoch']
  scored = 'the last weights (none kept as best)' if best is None else f'best epoch {best}'
  return (
    f'Run summary ({workdir}): {summary["step"]} steps, {scored}\n  {scores}\n  wall time '
    f'{format_duration(summary["wall_seconds"])} (training '
    f'{format_duration(summary["train_seconds"])}, '
    f'{summary["tokens_per_second"]:,.0f} tokens/s)'
  )
