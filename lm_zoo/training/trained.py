"""A finished run's best weights (`lm_zoo.runs.finished.load_trained`) scored
by any evaluator (`evaluate_workdir`, `evaluate_workdirs`), keeping its
progress where asked (`lm_zoo.training.evaluation_progress`)."""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any, Callable, Sequence

import ml_collections

from lm_zoo.configs import evaluation_config
from lm_zoo.errors import ConfigError, LMZooError, TrainingError
from lm_zoo.evaluation import (
  EvalResult,
  Evaluator,
  build_evaluator,
  needs_meta_learner,
  split_names,
)
from lm_zoo.remote import resolve
from lm_zoo.runs.finished import load_trained
from lm_zoo.training.evaluation_progress import MISSING, EvaluationProgress
from lm_zoo.training.meta_learner import (
  META_LEARNER_DIR,
  load_meta_learner,
)

log = logging.getLogger(__name__)


def workdir_evaluator(
  workdir: str | pathlib.Path,
  run_config: ml_collections.ConfigDict,
  config: ml_collections.ConfigDict,
  batch_size: int = 0,
) -> Evaluator:
  """The evaluator `config` (`evaluation_config`) names for a work
  directory's model: windows of the run's BPTT, `config.batch_size` rows
  or else `batch_size` or else the run's `data.test_batch_size`, and for
  'learned' the meta-learner `config.learned.meta_learner` (default:
  WORKDIR/meta_learner)."""
  meta_learner = None
  if needs_meta_learner(config):
    meta_learner = load_meta_learner(
      config.learned.meta_learner or resolve(workdir) / META_LEARNER_DIR
    )
  return build_evaluator(
    config,
    bptt=run_config.data.bptt,
    batch_size=config.batch_size or batch_size or run_config.data.test_batch_size,
    meta_learner=meta_learner,
  )


def evaluate_workdir(
  workdir: str | pathlib.Path,
  config: ml_collections.ConfigDict | None = None,
  data_dir: str | None = None,
  progress: str | pathlib.Path | None = None,
  store: Callable[[dict[str, EvalResult]], None] | None = None,
) -> dict[str, EvalResult]:
  """The best checkpoint of a work directory scored on `config.splits` by
  the evaluator `config` names (`lm_zoo.configs.evaluation_config`; default:
  static evaluation of valid and test at the run's test batch size), on the
  run's data (`data_dir`: where it is now, if not where the run recorded).

  With `progress` (a folder), the evaluator's choice and each split's result
  are kept there as they are made (`EvaluationProgress`), under a digest of
  the config, the weights and the data; the same evaluation stopped and
  started again resumes from them. They are removed once every split is
  scored and `store` (given the results: lm-zoo-eval's writing them) has
  returned."""
  config, splits = _checked_evaluation(config)
  run_config, corpus, model, params = load_trained(workdir, data_dir)
  evaluator = workdir_evaluator(workdir, run_config, config)
  kept = None
  if progress is None:
    prepared = evaluator.prepare(model, params, corpus)
    results = {split: evaluator.score(prepared, split) for split in splits}
  else:
    learned = getattr(evaluator, 'meta_learner', None)  # the 'learned' evaluator's rule
    rule = learned and (learned.meta_params, learned.segment_length, learned.initial_learning_rate)
    kept = EvaluationProgress.of(
      progress, config.evaluator, config, run_config, params, corpus, rule
    )
    kept.check_writable()
    results = _resumed(evaluator, kept, model, params, corpus, splits)
  if store is not None:
    store(results)
  if kept is not None:
    kept.clear()
  return results


def _resumed(evaluator, kept: EvaluationProgress, model, params, corpus, splits) -> dict:
  """Each split's result: kept, or scored with the kept choice (chosen and
  kept where there is none, or it is not one this evaluator could make)."""
  results = {split: kept.result(split) for split in splits}
  if None not in results.values():
    return results
  record, prepared = kept.choice(), None
  if record is not MISSING:
    try:
      prepared = evaluator.prepare_from(model, params, corpus, record)
    except (KeyError, IndexError, TypeError, ValueError) as err:
      if isinstance(err, LMZooError):
        raise
      log.warning(
        '%s: the kept choice is none of this evaluator (%s): choosing again', kept.folder, err
      )
  if prepared is None:
    prepared = evaluator.prepare(model, params, corpus)
    kept.save_choice(evaluator.choice_record(prepared))
  for split in (s for s, result in results.items() if result is None):
    results[split] = evaluator.score(prepared, split)
    kept.save_result(split, results[split])
  return results


def evaluate_workdirs(
  workdirs: Sequence[str | pathlib.Path],
  config: ml_collections.ConfigDict | None = None,
  data_dir: str | None = None,
) -> list[dict[str, EvalResult] | TrainingError]:
  """`evaluate_workdir` of several work directories (the seeds of a study):
  those of one model, data and windows are prepared and scored together
  (`Evaluator.prepare_many`; dynamic evaluation runs them in shared scans,
  `dynamic.members` at a time). Returns, in their order, each one's results
  or the TrainingError of its divergence."""
  if isinstance(workdirs, (str, os.PathLike)):
    raise ConfigError(
      f'workdirs is one work directory ({workdirs}), not a list of them: pass '
      '[workdir], or call evaluate_workdir'
    )
  workdirs = list(workdirs)
  named = [w for w in workdirs if not isinstance(w, (str, os.PathLike))]
  if named:
    raise ConfigError(f'workdirs must name work directories (paths), got {named[0]!r}')
  config, splits = _checked_evaluation(config)
  groups: list[tuple[tuple, Evaluator, Any, list[int], list]] = []
  for i, workdir in enumerate(workdirs):
    run_config, corpus, model, params = load_trained(workdir, data_dir)
    # A meta-learner is each run's own: its runs are scored one by one.
    key = (model, run_config.data.to_json_best_effort(sort_keys=True), config.evaluator, i)
    key = key if needs_meta_learner(config) else key[:3]
    group = next((g for g in groups if g[0] == key), None)
    if group is None:
      group = (key, workdir_evaluator(workdir, run_config, config), corpus, [], [])
      groups.append(group)
    group[3].append(i)
    group[4].append(params)
  outcomes: list = [None] * len(workdirs)
  for (model, *_), evaluator, corpus, indices, params_list in groups:
    # A weights prepare_many could not prepare stays its error in score_many.
    prepared = evaluator.prepare_many(model, params_list, corpus)
    scores = {split: evaluator.score_many(prepared, split) for split in splits}
    for k, i in enumerate(indices):
      results = {split: scores[split][k] for split in splits}
      errors = [r for r in results.values() if isinstance(r, TrainingError)]
      outcomes[i] = errors[0] if errors else results
  return outcomes


def _checked_evaluation(
  config: ml_collections.ConfigDict | None,
) -> tuple[ml_collections.ConfigDict, tuple[str, ...]]:
  """The evaluation config (default: static) and its splits, checked before
  any loading."""
  config = evaluation_config() if config is None else config
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(
      f'config must be an evaluation config (lm_zoo.configs.evaluation_config), '
      f'got a {type(config).__name__}'
    )
  splits = split_names(config.splits, required=True)
  if not needs_meta_learner(config):  # else its meta-learner is read with the model
    build_evaluator(config, bptt=1, batch_size=1)
  return config, splits
