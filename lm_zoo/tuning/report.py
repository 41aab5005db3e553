"""A study's report: its best trials as a Markdown table, and the best
trial's neighbourhood on parallel coordinates (the Mogrifier paper's Figs. 5
and 6), saved beside the study."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sqlite3
import urllib.parse
from typing import Sequence

import ml_collections
import optuna
import sqlalchemy

from lm_zoo.configs import evaluation_config
from lm_zoo.drawing import Series, parallel_coordinates_figure
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import DynamicRule, perplexity
from lm_zoo.tuning.spaces import position
from lm_zoo.tuning.study import DYNEVAL_FIELDS, FINISHED, STUDY_FILE, best_trial, study_counts

REPORT_FILE = 'report.md'
FIGURE_FILE = 'parallel_coordinates.png'


def neighbourhood(
  trials: Sequence[optuna.trial.FrozenTrial],
  best: optuna.trial.FrozenTrial,
  space: ml_collections.ConfigDict,
  width: float = 0.15,
) -> list[optuna.trial.FrozenTrial]:
  """The trials whose every hyper-parameter lies in a window `width` of its
  tuning range wide (on the log scale for log ranges), centred on the best
  trial's value: the paper's "about 15% of its entire tuning range"."""

  def near(trial):
    return all(
      abs(position(trial.params[name], spec) - position(best.params[name], spec)) <= width / 2
      for name, spec in space.items()
      if name in best.params
    )

  return [t for t in trials if near(t)]


def _perplexity(trial: optuna.trial.FrozenTrial) -> float:
  return trial.user_attrs.get('perplexity', perplexity(trial.value))


def read_study(workdir: str | pathlib.Path) -> optuna.Study:
  """The one study in `workdir`'s SQLite database, as `lm-zoo-tune` keeps it
  there (a study in a `--tune.study.storage` database is read with Optuna),
  opened read-only: the file is never written."""
  path = pathlib.Path(workdir) / STUDY_FILE
  if not path.is_file():
    raise ConfigError(f'{path} not found: is {workdir} a work directory of lm-zoo-tune?')
  # SQLite's URI form, quoted (a '#' or '?' in the path would end it), opens
  # the file read-only: reading a file that is not yet a study must not make it one.
  uri = f'file:{urllib.parse.quote(str(path.resolve()))}?mode=ro'
  engine = {'creator': lambda: sqlite3.connect(uri, uri=True, timeout=60)}
  try:
    storage = optuna.storages.RDBStorage('sqlite://', engine, skip_table_creation=True)
    names = [s.study_name for s in storage.get_all_studies()]
    if len(names) != 1:
      raise ConfigError(
        f'{path} holds {len(names)} studies ({", ".join(names) or "none started"}): '
        'give the work directory of one lm-zoo-tune study'
      )
    return optuna.load_study(study_name=names[0], storage=storage)
  # RuntimeError: a database of another Optuna version; StorageInternalError
  # wraps SQLAlchemy's.
  except (
    sqlalchemy.exc.SQLAlchemyError,
    optuna.exceptions.StorageInternalError,
    RuntimeError,
  ) as err:
    cause = err.__cause__ or err
    reason = str(getattr(cause, 'orig', None) or cause).splitlines()[0]
    if 'locked' in reason:
      raise ConfigError(f'{path} is locked by a writer ({reason}): try again') from None
    raise ConfigError(f'{path} is not a study database lm-zoo-tune can read ({reason})') from None


def best_so_far(study: optuna.Study) -> Series:
  """How the study's best improved: after each finished (complete or pruned)
  trial, in the order they were numbered, how many have finished and the
  valid perplexity of the best complete one so far (from the first complete
  trial on). Failed trials count for nothing: a retry has its own number."""
  counts, values, finished, best = [], [], 0, math.inf
  for trial in sorted(study.get_trials(deepcopy=False, states=FINISHED), key=lambda t: t.number):
    finished += 1
    if trial.state == optuna.trial.TrialState.COMPLETE and math.isfinite(trial.value):
      best = min(best, _perplexity(trial))
    if math.isfinite(best):
      counts.append(finished)
      values.append(best)
  return counts, values


def _counts_line(study: optuna.Study) -> str:
  """How many trials finished, failed and are still running or waiting."""
  counts = study_counts(study)
  surplus = f' ({counts["surplus"]} of them surplus starts)' if counts['surplus'] else ''
  return (
    f'{counts["finished"]} finished trials ({counts["complete"]} complete, '
    f'{counts["pruned"]} pruned), {counts["failed"]} failed{surplus}, '
    f'{counts["unsettled"]} running or waiting.'
  )


def _table(trials: Sequence[optuna.trial.FrozenTrial], names: Sequence[str]) -> list[str]:
  """`trials` as a Markdown table: number, loss, perplexity and each value."""
  lines = [
    '| trial | valid loss | perplexity | ' + ' | '.join(names) + ' |',
    '|---' * (3 + len(names)) + '|',
  ]
  for t in trials:
    cells = [f'{t.params[n]:.4g}' if n in t.params else '' for n in names]
    lines.append(
      f'| {t.number} | {t.value:.4f} | {_perplexity(t):.2f} | ' + ' | '.join(cells) + ' |'
    )
  return lines


def _draw_figure(
  study: optuna.Study,
  tune: ml_collections.ConfigDict,
  done: Sequence[optuna.trial.FrozenTrial],
  near: Sequence[optuna.trial.FrozenTrial],
  best: optuna.trial.FrozenTrial,
  path: pathlib.Path,
) -> None:
  """The `done` trials on parallel coordinates, `near` and `best` in red."""
  names = list(tune.space)
  axes = {n: (tune.space[n].low, tune.space[n].high, tune.space[n].log) for n in names}
  rows = [
    {**{n: t.params.get(n, tune.space[n].low) for n in names}, 'valid loss': t.value} for t in done
  ]
  index = {t.number: i for i, t in enumerate(done)}
  parallel_coordinates_figure(
    axes,
    rows,
    'valid loss',
    path,
    highlight=[index[t.number] for t in near],
    best=index[best.number],
    title=f'{study.study_name}: {len(done)} trials',
  )


def write_report(
  study: optuna.Study,
  tune: ml_collections.ConfigDict,
  workdir: str | pathlib.Path,
  top: int = 10,
  width: float = 0.15,
) -> str:
  """Writes `report.md` (the `top` trials by validation loss, the counts,
  the best trial's values and how to train it again) and, with matplotlib,
  `parallel_coordinates.png` into `workdir`; returns the report's text."""
  workdir = pathlib.Path(workdir)
  done = [
    t
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if math.isfinite(t.value)
  ]
  done.sort(key=lambda t: t.value)
  lines = [f'# Study {study.study_name}', '', _counts_line(study), '']
  best = best_trial(study)
  if best is None:
    lines.append('No trial has completed yet.')
  else:
    lines += _table(done[:top], list(tune.space))
    lines += [
      '',
      f'Best: trial {best.number}, valid loss {best.value:.4f} '
      f'(perplexity {_perplexity(best):.2f}).',
    ]
    lines += _commands(study, tune, best)
    near = neighbourhood(done, best, tune.space, width)
    lines += [
      '',
      f'{len(near)} complete trials lie within {width:.0%} of each range '
      'around the best (red in the figure): validation loss '
      f'{min(t.value for t in near):.4f} to {max(t.value for t in near):.4f}.',
    ]
    if importlib.util.find_spec('matplotlib') is None:
      lines += ['', "(No figure: matplotlib is not installed; pip install 'lm_zoo[plot]'.)"]
    else:
      _draw_figure(study, tune, done, near, best, workdir / FIGURE_FILE)
      lines += ['', f'![parallel coordinates]({FIGURE_FILE})']
  text = '\n'.join(lines) + '\n'
  (workdir / REPORT_FILE).write_text(text)
  return text


def _flag_value(value) -> str:
  """`value` as a --config flag writes it: a number to 4 significant
  digits, a tuple of them joined by commas."""
  if isinstance(value, (tuple, list)):
    return ','.join(_flag_value(v) for v in value)
  return f'{value:.4g}' if isinstance(value, float) else str(value)


def _scored_settings(dynamic: ml_collections.ConfigDict, tuned: dict) -> dict:
  """The `dynamic.*` settings that score as the trials did, searching
  nothing: the searched ones at the best trial's values (`tuned`), every
  other the trials' own where it is not the default (the rule is the
  config file's; `search_tokens` drives no search of one setting)."""
  defaults = evaluation_config('dynamic').dynamic
  settings = {}
  for field, value in dynamic.items():
    if field in tuned:
      settings[field] = tuned[field]
    elif field in DYNEVAL_FIELDS or (
      field not in ('rule', 'search_tokens') and value != defaults[field]
    ):
      settings[field] = value
  return settings


def _commands(
  study: optuna.Study, tune: ml_collections.ConfigDict, best: optuna.trial.FrozenTrial
) -> list[str]:
  """The report's lines with the commands that use the best trial: train it
  again, or (a dynamic-evaluation study) score valid and test with it."""
  lines = []
  if 'workdir' in best.user_attrs:
    lines += [
      "Train it again (the trial's own config, read from its work directory):",
      '',
      f'    lm-zoo-train --config=experiments/from_workdir.py:'
      f'{best.user_attrs["workdir"]} --workdir=runs/best_of_{study.study_name}',
    ]
  if tune.kind == 'dyneval':
    evaluation = tune.dyneval.evaluation
    tuned = {tune.space[name].field: value for name, value in best.params.items()}
    flags = ' '.join(
      f'--config.dynamic.{field}={_flag_value(value)}'
      for field, value in _scored_settings(evaluation.dynamic, tuned).items()
    )
    rule = evaluation.dynamic.rule
    config = (
      f'experiments/dyneval_{rule}.py'
      if rule in tuple(DynamicRule)
      else f'experiments/dyneval_sgd.py --config.dynamic.rule={rule}'
    )
    lines += [
      'Score valid and test with it:',
      '',
      f'    lm-zoo-eval --workdir={tune.dyneval.workdir} --config={config} {flags}',
    ]
  return lines
