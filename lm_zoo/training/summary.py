"""The last phase of a run, `finish`: the best weights scored on the final
splits, text sampled from them, and the summary (summary.json, and the lines
logged)."""

from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Any, Sequence

import jax

from lm_zoo.runtime import environment
from lm_zoo.runs.files import write_text_atomically
from lm_zoo.runs.files import is_main_process
from lm_zoo.evaluation import EvalResult
from lm_zoo.progress import format_duration
from lm_zoo.training.run import Run, Trainer
from lm_zoo.training.scoring import final_batch_size, final_scores, record_samples
from lm_zoo.training.steps import TrainState

log = logging.getLogger(__name__)


def finish(t: Trainer, run: Run, final_splits: Sequence[str]) -> dict[str, Any]:
  """Scores the best weights on `final_splits`, samples text from them, and
  writes the run summary."""
  train_seconds = time.perf_counter() - run.train_start  # by this process
  best = t.checkpoints.restore_best(run.state.params)
  if best is None:  # stopped before the first epoch ended: use the last params
    params, best_meta = run.state.params, {'epoch': run.progress.epoch}
  else:
    params, best_meta = best
  # the whole run's, over the processes it was resumed by
  seconds, tokens = run.trained_before + train_seconds, run.all_tokens_trained()
  summary: dict[str, Any] = {
      'step': run.step, 'best_epoch': best_meta['epoch'],
      'train_seconds': round(run.trained_before + train_seconds, 1),
      'tokens_per_second': round(tokens / max(seconds, 1e-9), 1),
      'num_params': count_params(run.state), 'unit': t.corpus.unit,
      'skipped_updates': run.progress.skipped_updates, 'rollbacks': run.progress.rollbacks,
      'environment': environment()}
  scores = final_scores(t.config, t.workdir, t.model, t.corpus, params, final_splits)
  for split, result in scores.items():
    log.info('%s %s (%d tokens, batch %d)', split, result.summary(),
             result.num_tokens, final_batch_size(t.config, split))
    t.metrics.write(split, step=run.step, final=True, **result.as_dict())
    summary[split] = result.as_dict()
  if t.config.generate.num_lines > 0:
    summary['samples'] = record_samples(t.model, params, t.corpus, t.config, t.metrics,
                                        run.step)
  summary['wall_seconds'] = round(time.perf_counter() - t.started, 1)
  if is_main_process():
    write_text_atomically(t.workdir / 'summary.json', json.dumps(summary, indent=2))
  log.info('%s', run_summary(summary, t.workdir))
  return summary


def count_params(state: TrainState) -> int:
  return int(sum(x.size for x in jax.tree.leaves(state.params)))


def run_summary(summary: dict[str, Any], workdir: pathlib.Path) -> str:
  """The lines printed when a run ends: its scores, time and speed."""
  scores = '  '.join(f"{split} {EvalResult(summary[split]['loss'], 0, summary['unit']).summary()}"
                     for split in ('valid', 'test') if split in summary)
  return (f'Run summary ({workdir}): {summary["step"]} steps, best epoch '
          f'{summary["best_epoch"]}\n  {scores}\n  wall time '
          f'{format_duration(summary["wall_seconds"])} (training '
          f'{format_duration(summary["train_seconds"])}, '
          f'{summary["tokens_per_second"]:,.0f} tokens/s)')
