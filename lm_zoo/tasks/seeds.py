"""Seed studies: train every model of a set once per seed, then report each
model's mean and spread and its paired difference to a reference model.

A seed draws the initial parameters and every dropout mask; the data order is
fixed. Seed s of every model is one pair: the difference of two models over
the same seeds removes what the seeds share. With n seeds a paired difference
d_1..d_n has the two-sided 95% interval mean(d) ± t(0.975, n-1) sd(d) / sqrt(n)
(Student's t); an ordering holds beyond the seed spread when that interval
excludes zero.

Runs go seed by seed (every model of seed 0 first), each in its own work
directory `{workdir}/{model}_s{seed}`, so a study stopped at any point resumes
with the same command and its finished seeds are already complete pairs.
Several workers (the same command on other cores or hosts sharing the
folder) split the study: each skips the runs another holds (a work
directory's lock), and waits for them once its own are done; they split
the evaluations so too (`lm_zoo.tasks.study_evaluations`).

With `config.stack` each model's seeds (consecutive, ascending) train as
one stack (`train_and_evaluate`'s `num_seeds`) in
`{workdir}/{model}_s{first}-{last}`, the run of seed s in its `seed_s`: the
same runs, faster per seed on a GPU where the model's kernels leave it idle,
slower on a CPU. Workers split such a study model by model. A seed whose
loss turns non-finite stops its stack (which records it in
`diverged.json`); that model's seeds are then trained one by one as without
`stack`, where the diverged run is a data point. A model with a run alone
begun (`{model}_s{seed}`, by an unstacked study or after a diverged stack)
goes on alone; a study without `stack` does not read stacks.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from typing import Mapping, Sequence

import ml_collections
import numpy as np
from scipy import stats

from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.evaluation import mean_and_spread
from lm_zoo.tasks.runs import train_or_read, train_stack_or_read
from lm_zoo.tasks.study_evaluations import (
  SPLITS,
  evaluate_runs,
  evaluations_report,
  mean_and_spread_text,
  study_evaluations,
)
from lm_zoo.training.seed_axis import check_num_seeds, seed_dir

log = logging.getLogger(__name__)


def run_seed_study(config: ml_collections.ConfigDict) -> list[dict]:
  """One row per (seed, model): valid and test perplexity (inf when the run
  diverged), parameter count, training time (a stacked run's is its
  stack's) and work directory.

  `config` (experiments/seed_study.py): `models` maps names to full training
  configs; `seeds` lists the seeds; `reference` names the model the others are
  compared with; `workdir` holds one directory per run; `stack` (optional,
  default False) trains each model's seeds as one stack; `evaluations`
  (optional) names evaluation configs that score every run's best weights
  besides its own scores (`lm_zoo.tasks.study_evaluations`: their fields
  join each row).
  """
  if not config.models:
    raise ConfigError('config.models is empty: name at least one training config')
  if config.reference not in config.models:
    raise ConfigError(
      f'config.reference is {config.reference!r}: name one of '
      f'config.models ({", ".join(config.models)})'
    )
  seeds = list(config.seeds)
  if not seeds or len(set(seeds)) != len(seeds):
    raise ConfigError(f'config.seeds must list distinct seeds, got {seeds}')
  evaluations = study_evaluations(config)
  runs = [(seed, name) for seed in seeds for name in config.models]
  if config.get('stack', False):
    summaries = _train_stacks(config, seeds)
  else:
    summaries = {}
    # Runs another worker holds are left to it at first, then waited for.
    for wait in (False, True):
      for seed, name in runs:
        if (seed, name) not in summaries:
          workdir = _workdir(config, name, seed)
          summary = train_or_read(_seed_config(config, name, seed), workdir, wait=wait)
          if summary is not None:
            summaries[seed, name] = summary, workdir
  rows = []
  for seed, name in runs:
    summary, workdir = summaries[seed, name]
    diverged = summary.get('diverged', False)
    row = {
      'model': name,
      'seed': seed,
      **{
        f'{split}_perplexity': math.inf if diverged else summary[split]['perplexity']
        for split in SPLITS
      },
      'num_params': summary.get('num_params', 0),
      'train_seconds': summary.get('train_seconds', math.nan),
      'workdir': str(workdir),
    }
    log.info('%s', row)
    rows.append(row)
  evaluate_runs(rows, evaluations)
  return rows


def _train_stacks(
  config: ml_collections.ConfigDict, seeds: list[int]
) -> dict[tuple[int, str], tuple[dict, pathlib.Path]]:
  """`run_seed_study`'s runs with `config.stack`: (seed, model) -> (summary,
  work directory)."""
  if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
    raise ConfigError(
      f'config.seeds must be consecutive and ascending to train them stacked, '
      f'got {seeds}: list them so, or set config.stack=False'
    )
  check_num_seeds(len(seeds))
  summaries = {}
  for wait in (False, True):  # as for runs alone: stacks another worker holds wait
    for name in config.models:
      if (seeds[0], name) not in summaries:
        runs = _stack_or_alone(config, name, seeds, wait)
        for seed, run in zip(seeds, runs or ()):
          summaries[seed, name] = run
  return summaries


def _stack_or_alone(
  config: ml_collections.ConfigDict, name: str, seeds: list[int], wait: bool
) -> list[tuple[dict, pathlib.Path]] | None:
  """Model `name`'s (summary, work directory) per seed: from its stack, or
  from runs alone where one was begun or the stack diverged; None when
  another worker holds the stack or a run and `wait` is False."""
  alone = [_workdir(config, name, seed) for seed in seeds]
  stack_dir = pathlib.Path(config.workdir) / f'{name}_s{seeds[0]}-{seeds[-1]}'
  diverged = stack_dir / 'diverged.json'
  if len(seeds) > 1 and not diverged.is_file() and not any(workdir.exists() for workdir in alone):
    try:
      stack = train_stack_or_read(
        _seed_config(config, name, seeds[0]), stack_dir, len(seeds), wait=wait
      )
    except TrainingError as err:
      log.warning('%s: %s; training its seeds one by one', stack_dir, err)
      stack_dir.mkdir(parents=True, exist_ok=True)
      diverged.write_text(json.dumps({'error': str(err)}, indent=2))
    else:
      if stack is None:
        return None
      by_seed = {run['seed']: run for run in stack['runs']}
      return [(by_seed[seed], seed_dir(stack_dir, seed)) for seed in seeds]
  runs = [
    (train_or_read(_seed_config(config, name, seed), workdir, wait=wait), workdir)
    for seed, workdir in zip(seeds, alone)
  ]
  return None if any(summary is None for summary, _ in runs) else runs


def _seed_config(
  config: ml_collections.ConfigDict, name: str, seed: int
) -> ml_collections.ConfigDict:
  run_config = ml_collections.ConfigDict(config.models[name].to_dict())
  run_config.seed = seed
  return run_config


def _workdir(config: ml_collections.ConfigDict, name: str, seed: int) -> pathlib.Path:
  return pathlib.Path(config.workdir) / f'{name}_s{seed}'


def paired_difference(
  values: Mapping[int, float], reference: Mapping[int, float]
) -> dict[str, float]:
  """values - reference over the seeds both have: mean, sample std, n, and
  the half-width of the two-sided 95% Student-t interval of the mean (nan
  below two pairs). `resolved` says whether the interval excludes zero."""
  seeds = sorted(set(values) & set(reference))
  d = np.array([values[s] - reference[s] for s in seeds], dtype=np.float64)
  mean, spread = mean_and_spread(d) if len(d) else (math.nan, math.nan)
  half = (
    float(stats.t.ppf(0.975, len(d) - 1)) * spread / math.sqrt(len(d)) if len(d) > 1 else math.nan
  )
  return {
    'mean': mean,
    'std': spread,
    'n': len(d),
    'half_width': half,
    'resolved': bool(abs(mean) > half) if len(d) > 1 else False,
  }


def summarise(rows: Sequence[Mapping], reference: str) -> dict[str, dict]:
  """Per model (the reference first, then in the rows' order): the seeds,
  `{split}` mean ± std over the runs that converged, the number that
  diverged, and `{split}_vs_reference`, the paired difference to
  `reference` (`paired_difference`)."""
  models = list(dict.fromkeys(r['model'] for r in rows))
  if reference not in models:
    raise ConfigError(f'reference {reference!r} has no runs: choose one of {", ".join(models)}')
  models.remove(reference)
  models.insert(0, reference)
  per_seed = {
    m: {
      split: {
        r['seed']: r[f'{split}_perplexity']
        for r in rows
        if r['model'] == m and math.isfinite(r[f'{split}_perplexity'])
      }
      for split in SPLITS
    }
    for m in models
  }
  summary = {}
  for m in models:
    entry = {
      'seeds': sorted(r['seed'] for r in rows if r['model'] == m),
      'diverged': sum(
        1 for r in rows if r['model'] == m and not math.isfinite(r['valid_perplexity'])
      ),
    }
    for split in SPLITS:
      values = list(per_seed[m][split].values())
      entry[split] = mean_and_spread(values) if values else (math.nan, math.nan)
      if m != reference:
        entry[f'{split}_vs_reference'] = paired_difference(
          per_seed[m][split], per_seed[reference][split]
        )
    summary[m] = entry
  return summary


def seed_report(rows: Sequence[Mapping], reference: str, evaluations: Sequence[str] = ()) -> str:
  """Markdown tables: each model's mean ± std, and its paired difference to
  `reference` with the 95% interval and whether it excludes zero; then each
  of `evaluations` (names of the study's) beside the static score of the
  same tokens."""
  summary = summarise(rows, reference)
  lines = ['| model | seeds | valid, mean ± std | test, mean ± std |', '|---|---|---|---|']
  for m, e in summary.items():
    diverged = f' ({e["diverged"]} diverged)' if e['diverged'] else ''
    lines.append(
      f'| {m} | {len(e["seeds"])}{diverged} | '
      + ' | '.join(mean_and_spread_text(*e[s]) for s in SPLITS)
      + ' |'
    )
  if len(summary) > 1:
    lines += [
      '',
      f'| model − {reference} (same seeds) | pairs | valid: mean ± std '
      '[95% interval] | test: mean ± std [95% interval] | beyond the seed spread |',
      '|---|---|---|---|---|',
    ]
  for m, e in summary.items():
    if m == reference:
      continue
    cells = []
    for split in SPLITS:
      d = e[f'{split}_vs_reference']
      cells.append(
        f'{d["mean"]:+.2f} ± {d["std"]:.2f} '
        f'[{d["mean"] - d["half_width"]:+.2f}, {d["mean"] + d["half_width"]:+.2f}]'
        if d['n'] > 1
        else f'{d["mean"]:+.2f} (one pair: no interval)'
      )
    verdict = {
      (True, True): 'yes, both splits',
      (True, False): 'valid only',
      (False, True): 'test only',
      (False, False): 'no',
    }[tuple(e[f'{s}_vs_reference']['resolved'] for s in SPLITS)]
    lines.append(f'| {m} | {e["valid_vs_reference"]["n"]} | {" | ".join(cells)} | {verdict} |')
  evaluated = evaluations_report(rows, evaluations)
  return '\n'.join(lines + (['', evaluated] if evaluated else []))
