"""A seed study's evaluations beyond its runs' own scores: each run's best
weights scored by each evaluation config the study names (dynamic evaluation
with its search on valid, MC dropout, a tuned temperature), and the table of
their means over the seeds beside the static score of the same tokens.

`config.evaluations` maps a name (letters, digits and '_': it names files
and row fields) to an evaluation config (`lm_zoo.configs.evaluation_config`,
`experiments/dyneval_*.py`). Each run's scores are kept in
`{run}/study_evaluations/{name}.json` with the config that made them (less
`dynamic.members`, which changes how fast, not what): a study run again reads
them back, and scores again where the config changed. An
evaluation that diverges is a data point (infinite perplexity, its error
kept), not the study's end. Workers sharing a study score each run's
evaluation once, holding `{name}.lock` beside its scores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import pathlib
import re
from typing import Mapping, Sequence

import ml_collections

from lm_zoo.configs import evaluation_config, unknown_fields
from lm_zoo.errors import ConfigError, TrainingError, WorkdirInUse
from lm_zoo.evaluation import (
  EvalResult,
  build_evaluator,
  mean_and_spread,
  needs_meta_learner,
  split_names,
)
from lm_zoo.runs.files import read_json, write_text_atomically
from lm_zoo.runs.workdir import file_lock
from lm_zoo.training import evaluate_workdirs

log = logging.getLogger(__name__)

SPLITS = ('valid', 'test')  # what a seed study scores and reports
FOLDER = 'study_evaluations'


def study_evaluations(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """`config.evaluations` checked before any run: names that can name files,
  evaluation configs whose every field is one of `evaluation_config`'s and
  an evaluator accepts, each completed with the defaults of the fields it
  leaves out.

  Raises:
    ConfigError: naming the evaluation and the fix.
  """
  evaluations = config.get('evaluations') or {}
  if not isinstance(evaluations, (Mapping, ml_collections.ConfigDict)):
    raise ConfigError(
      'config.evaluations must map names to evaluation configs, got a '
      f'{type(evaluations).__name__}: {{"rms": experiments/dyneval_rms.py\'s config}}'
    )
  checked = {}
  for name, evaluation in evaluations.items():
    if not re.fullmatch(r'[A-Za-z0-9_]{1,100}', name):
      raise ConfigError(
        f'config.evaluations: {name!r} is not a name of 1 to 100 letters, digits and '
        "'_': rename it (it names files and result fields)"
      )
    if not isinstance(evaluation, ml_collections.ConfigDict) or 'evaluator' not in evaluation:
      raise ConfigError(
        f'config.evaluations.{name} is not an evaluation config: give one '
        'of lm_zoo.configs.evaluation_config or experiments/dyneval_*.py'
      )
    if needs_meta_learner(evaluation):
      raise ConfigError(
        f'config.evaluations.{name}: the {evaluation.evaluator} evaluator needs each run '
        'meta-trained first (lm-zoo-meta-train): score it with lm-zoo-eval'
      )
    checked[name] = _completed(f'config.evaluations.{name}', evaluation)
  return checked


def _completed(where: str, evaluation: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`evaluation` over `evaluation_config`'s defaults, every field known and
  accepted by its evaluator (`where` names it in the errors)."""
  full = evaluation_config(evaluation.evaluator)
  given = json.loads(evaluation.to_json_best_effort())
  unknown = unknown_fields(given, json.loads(full.to_json_best_effort()))
  if unknown:
    raise ConfigError(
      f'{where} has fields an evaluation config lacks: {", ".join(unknown)}: '
      'check their spelling (lm_zoo.configs.evaluation_config)'
    )
  try:
    full.update(evaluation)
    split_names(full.splits, required=True)
    build_evaluator(full, bptt=1, batch_size=1)
  except (ConfigError, TypeError, ValueError) as err:
    raise ConfigError(f'{where}: {err}') from None
  return full


def evaluate_runs(
  rows: Sequence[dict], evaluations: Mapping[str, ml_collections.ConfigDict]
) -> None:
  """Adds to each converged run's row `{name}_{split}_perplexity`, and where
  the evaluator also scores the same tokens statically (dynamic evaluation)
  `{name}_{split}_static_perplexity` and `{name}_settings`, the setting its
  search chose. The runs an evaluation has not scored yet are scored
  together (`evaluate_workdirs`)."""
  # A diverged run has no weights worth scoring.
  converged = [row for row in rows if math.isfinite(row['valid_perplexity'])]
  workdirs = [pathlib.Path(row['workdir']) for row in converged]
  models = [row['model'] for row in converged]
  for name, evaluation in evaluations.items():
    for row, scores in zip(converged, _scores(workdirs, models, name, evaluation)):
      for split, score in scores.items():
        row[f'{name}_{split}_perplexity'] = score['perplexity']
        if 'static_perplexity' in score:
          row[f'{name}_{split}_static_perplexity'] = score['static_perplexity']
          row[f'{name}_settings'] = score['settings']


def _scores(
  workdirs: Sequence[pathlib.Path],
  models: Sequence[str],
  name: str,
  evaluation: ml_collections.ConfigDict,
) -> list[dict[str, dict]]:
  """Each work directory's scores: those kept for this config read back,
  the others computed and kept, each as it finishes, or a model's together
  where dynamic evaluation runs several at once (`dynamic.members` not 1).

  A run's evaluation is scored holding `{name}.lock` beside its scores,
  one run (or one model's runs scored together) at a time: several workers
  of one study split the runs and score each once. Runs another worker
  holds are left to it; once every missing run is held elsewhere, this
  worker waits for the first (holding no lock) and reads them again."""
  wanted = _scoring_config(evaluation)
  paths = [_scores_path(workdir, name) for workdir in workdirs]
  kept = [_kept_scores(path, wanted) for path in paths]
  together = evaluation.evaluator == 'dynamic' and evaluation.dynamic.members != 1
  while None in kept:
    scored = False
    for batch in _batches([i for i, s in enumerate(kept) if s is None], models, together):
      with contextlib.ExitStack() as held:
        mine = [i for i in batch if _hold(held, paths[i])]
        # Another worker may have scored them before this one took the locks.
        for i in mine:
          kept[i] = _kept_scores(paths[i], wanted)
        mine = [i for i in mine if kept[i] is None]
        if mine:
          outcomes = evaluate_workdirs([workdirs[i] for i in mine], evaluation)
          for i, outcome in zip(mine, outcomes):
            kept[i] = _stored(paths[i], wanted, outcome, evaluation)
          scored = True
    if None in kept and not scored:
      with contextlib.ExitStack() as held:
        _hold(held, paths[kept.index(None)], wait=True)
      kept = [_kept_scores(path, wanted) if s is None else s for s, path in zip(kept, paths)]
  return kept


def _batches(missing: list[int], models: Sequence[str], together: bool) -> list[list[int]]:
  """The missing runs as they are scored: each alone, or each model's
  together."""
  if not together:
    return [[i] for i in missing]
  return [[i for i in missing if models[i] == m] for m in dict.fromkeys(models[i] for i in missing)]


def _hold(held: contextlib.ExitStack, path: pathlib.Path, wait: bool = False) -> bool:
  """Whether this process now holds the lock of the scores at `path` (kept
  in `held`); False when another holds it and `wait` is False."""
  path.parent.mkdir(parents=True, exist_ok=True)
  lock = path.with_suffix('.lock')
  if wait:
    log.info('%s: waiting for the worker scoring it', lock)
  try:
    held.enter_context(file_lock(lock, wait, f'{lock} is held by {{holder}}'))
  except WorkdirInUse as other:
    log.info('%s: left to it', other)
    return False
  return True


def _scoring_config(evaluation: ml_collections.ConfigDict) -> dict:
  """The evaluation's config as kept with its scores, without
  `dynamic.members`, which changes how fast, not what."""
  wanted = json.loads(evaluation.to_json_best_effort())
  wanted.get('dynamic', {}).pop('members', None)
  return wanted


def _scores_path(workdir: pathlib.Path, name: str) -> pathlib.Path:
  """Where a run keeps evaluation `name`'s scores, once neither its folder
  nor those files are links or things of another kind: lm_zoo writes
  nothing through a link, and reads no scores it did not write."""
  folder = workdir / FOLDER
  path = folder / f'{name}.json'
  for what, wanted_dir in ((folder, True), (path, False), (path.with_suffix('.lock'), False)):
    link = what.is_symlink()
    if link or (what.exists() and what.is_dir() != wanted_dir):
      kind = 'a symbolic link' if link else 'a file' if wanted_dir else 'a folder'
      raise ConfigError(
        f'{what} is {kind}, where a study keeps its scores: remove it to score the run again'
      )
  return path


def _kept_scores(path: pathlib.Path, wanted: dict) -> dict | None:
  """The scores at `path` if they were computed with `wanted`, else None.

  Raises:
    ConfigError: the file is damaged (it names the file: delete it to score again).
  """
  if not path.is_file():
    return None
  fix = 'delete it to score the run again'
  stored = read_json(path, 'a study keeps the scores it computed', fix)
  if not isinstance(stored, dict) or stored.get('config') != wanted:
    if isinstance(stored, dict) and 'config' in stored:
      return None  # scored with another config: scored again
    raise ConfigError(f'{path} holds no scores a study wrote: {fix}')
  scores = stored.get('scores')
  splits = split_names(wanted['splits'], required=True)
  if not isinstance(scores, dict) or not all(_a_score(scores.get(split)) for split in splits):
    raise ConfigError(f'{path} lacks the score of a split, or holds one that is no number: {fix}')
  return scores


def _a_score(score) -> bool:
  perplexity = score.get('perplexity') if isinstance(score, dict) else None
  return isinstance(perplexity, (int, float)) and not isinstance(perplexity, bool)


def _stored(path: pathlib.Path, wanted: dict, outcome, evaluation) -> dict[str, dict]:
  """The scores of one run's outcome (an evaluation that diverged is a data
  point of the study, not its end: infinite, its error kept), written."""
  if isinstance(outcome, TrainingError):
    log.warning('%s: %s diverged: %s', path.parent.parent, path.stem, outcome)
    scores = {
      split: {'perplexity': math.inf, 'error': str(outcome)}
      for split in split_names(evaluation.splits)
    }
  else:
    scores = {}
    for split, result in outcome.items():
      scores[split] = {'perplexity': result.perplexity}
      if 'static_loss' in result.details:
        static = EvalResult(result.details['static_loss'], result.num_tokens, result.unit)
        scores[split].update(
          static_perplexity=static.perplexity, settings=dict(result.details['settings'])
        )
  write_text_atomically(path, json.dumps({'config': wanted, 'scores': scores}, indent=2))
  return scores


def evaluations_report(rows: Sequence[Mapping], names: Sequence[str]) -> str:
  """A Markdown table per model and evaluation: the mean ± std over the
  seeds of the static score of the same tokens, the evaluation's score and
  the gain (static − evaluated, seed by seed); empty without evaluations."""
  lines = []
  for name in names:
    for model in dict.fromkeys(r['model'] for r in rows):
      for split in SPLITS:
        scored = [r for r in rows if r['model'] == model and f'{name}_{split}_perplexity' in r]
        if not scored:
          continue
        if not lines:
          lines = [
            '| model | evaluation | seeds | split | static, same tokens | evaluated | gain |',
            '|---|---|---|---|---|---|---|',
          ]
        # A diverged evaluation is counted, not averaged, as a diverged run is.
        finite = [r for r in scored if math.isfinite(r[f'{name}_{split}_perplexity'])]
        diverged = len(scored) - len(finite)
        seeds = f'{len(scored)} ({diverged} diverged)' if diverged else f'{len(scored)}'
        evaluated = [r[f'{name}_{split}_perplexity'] for r in finite]
        static = [r.get(f'{name}_{split}_static_perplexity', math.nan) for r in finite]
        gains = [s - e for s, e in zip(static, evaluated)]
        cells = [_text(values) for values in (static, evaluated, gains)]
        lines.append(f'| {model} | {name} | {seeds} | {split} | {" | ".join(cells)} |')
  return '\n'.join(lines)


def mean_and_spread_text(mean: float, spread: float) -> str:
  """'mean ± std' to two decimals; the mean alone where there is no spread
  (one seed)."""
  return f'{mean:.2f}' if math.isnan(spread) else f'{mean:.2f} ± {spread:.2f}'


def _text(values: Sequence[float]) -> str:
  if not values or any(math.isnan(v) for v in values):
    return '-'
  return mean_and_spread_text(*mean_and_spread(values))
