"""The last phase of a stack of seeds (lm_zoo/training/stacked.py),
`finish_stack`: each seed's best weights scored on the final splits and
sampled from, its summary in WORKDIR/seed_S/summary.json, and the stack's,
with each split's mean and spread over the seeds, in WORKDIR/summary.json."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Sequence

import jax

from lm_zoo.evaluation import EvalResult, mean_and_spread
from lm_zoo.runtime import environment
from lm_zoo.runs.files import write_text_atomically
from lm_zoo.training.scoring import final_scores, record_samples
from lm_zoo.training.stacked_run import StackRun, seed_dir, take_seed
from lm_zoo.training.summary import run_summary

log = logging.getLogger(__name__)


def finish_stack(run: StackRun, final_splits: Sequence[str], started: float) -> dict[str, Any]:
  """Scores each seed's best weights by the config's evaluator, samples
  `generate.num_lines` from them, and writes the summaries; returns the
  stack's. `started`: perf_counter() when this
  process began the stack."""
  seconds = run.seconds_trained()
  tokens_per_second = run.progress.train_tokens / max(seconds, 1e-9)
  seed_summaries = []
  for k, seeded in enumerate(run.configs):
    params = take_seed(run.state.params, k)
    best = run.best[k].restore_best(params)
    params, best_meta = best if best is not None else (params, {'epoch': run.progress.epoch})
    seed_summary = {
        'seed': seeded.seed, 'step': run.step, 'best_epoch': best_meta['epoch'],
        'train_seconds': round(seconds, 1),
        'tokens_per_second': round(tokens_per_second / len(run.configs), 1),
        'num_params': int(sum(x.size for x in jax.tree.leaves(params))),
        'unit': run.corpus.unit, 'skipped_updates': 0, 'rollbacks': 0,
        'valid_curve': [figure(EvalResult(loss, 0, run.corpus.unit))
                        for loss in run.progress.valid_losses[k]],
        'environment': environment()}
    folder = seed_dir(run.workdir, seeded.seed)
    for split, result in final_scores(seeded, folder, run.model, run.corpus, params,
                                      final_splits).items():
      run.metrics.write(split, step=run.step, seed=seeded.seed, final=True, **result.as_dict())
      seed_summary[split] = result.as_dict()
    if seeded.generate.num_lines > 0:  # what the seed's run alone samples
      seed_summary['samples'] = record_samples(run.model, params, run.corpus, seeded,
                                               run.metrics, run.step,
                                               tag=f'seed_{seeded.seed}/samples',
                                               label=f'seed {seeded.seed} sample')
    seed_summaries.append(seed_summary)
  wall_seconds = round(time.perf_counter() - started, 1)  # the stack's, every seed's
  for seed_summary in seed_summaries:
    seed_summary['wall_seconds'] = wall_seconds
    folder = seed_dir(run.workdir, seed_summary['seed'])
    write_text_atomically(folder / 'summary.json', json.dumps(seed_summary, indent=2))
    log.info('seed %d: %s', seed_summary['seed'],
             run_summary(seed_summary, folder).replace('\n', ';'))
  summary: dict[str, Any] = {
      'step': run.step, 'seeds': [c.seed for c in run.configs],
      'train_seconds': round(seconds, 1), 'tokens_per_second': round(tokens_per_second, 1),
      'num_params': seed_summaries[0]['num_params'], 'unit': run.corpus.unit,
      'runs': seed_summaries, 'environment': environment(), 'wall_seconds': wall_seconds}
  for split in final_splits:
    results = [EvalResult(s[split]['loss'], s[split]['num_tokens'], run.corpus.unit)
               for s in seed_summaries]
    mean, std = mean_and_spread([figure(result) for result in results])
    summary[split] = {'mean': mean, 'std': std, 'measure': measure(run.corpus.unit)}
    log.info('%s over %d seeds: %s', split, len(results), spread(results))
  write_text_atomically(run.workdir / 'summary.json', json.dumps(summary, indent=2))
  return summary


def measure(unit: str) -> str:
  """What a paper reports for `unit`: perplexity for words, else bpc."""
  return 'perplexity' if unit == 'word' else 'bpc'


def figure(result: EvalResult) -> float:
  """The figure a paper reports for `result`: its perplexity for words,
  else its bits per character."""
  return result.perplexity if result.unit == 'word' else result.bits_per_token


def spread(results: Sequence[EvalResult]) -> str:
  """'perplexity 86.52 ± 0.45 (seeds: 86.20, 86.84)': the mean and sample
  standard deviation over the seeds (nan for one)."""
  values = [figure(result) for result in results]
  mean, std = mean_and_spread(values)
  return (f'{measure(results[0].unit)} {mean:.2f} ± {std:.2f} (seeds: '
          f'{", ".join(f"{v:.2f}" for v in values)})')
