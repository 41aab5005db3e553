"""What a tuning study's trials run: a training run (kind 'train') or a
dynamic evaluation of a trained model (kind 'dyneval'), each returning the
validation loss it reached, and where a trial's training run lives."""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
from typing import Callable

import ml_collections
import optuna

from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.training import train_and_evaluate
from lm_zoo.tuning.spaces import set_fields, suggest

log = logging.getLogger(__name__)

TRIALS_DIR = 'trials'


class SurplusTrial(Exception):
  """Another worker started the study's last trial first: this one does not run."""


def trial_workdir(
  workdir: str | pathlib.Path, study_name: str, trial: optuna.trial.FrozenTrial
) -> pathlib.Path:
  """A trial's work directory, WORKDIR/trials/STUDY/trial_NNNN; a retry of a
  failed trial reuses the failed one's, so its training resumes from the
  last checkpoint."""
  origin = trial.system_attrs.get('failed_trial', trial.number)
  return pathlib.Path(workdir) / TRIALS_DIR / study_name / f'trial_{origin:04d}'


def frozen_trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
  """The trial numbered `number` as the study's storage holds it (not a copy)."""
  return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _check_not_surplus(study: optuna.Study, trial: optuna.Trial, num_trials: int) -> None:
  """Raises SurplusTrial when `num_trials` trials before this one (finished or
  still running) already fill the study: two workers asked for the last one
  at once."""
  ahead = sum(
    t.number < trial.number and t.state != optuna.trial.TrialState.FAIL
    for t in study.get_trials(deepcopy=False)
  )
  if ahead >= num_trials:
    trial.set_user_attr('surplus', True)
    raise SurplusTrial(f'trial {trial.number}: the study has its {num_trials} trials')


def _prune_infeasible(trial: optuna.Trial, startup_trials: int, err: ConfigError) -> None:
  """Prunes a trial whose values no model of the base config takes (a budget
  below the smallest model): a point the sampler learns to avoid, not the
  study's end. Raises `err` instead (the trial then fails) where every trial
  before it, at least `startup_trials` with it, could not run either: the
  base config is what cannot, whatever the values."""
  trial.set_user_attr('infeasible', str(err))
  before = [t for t in trial.study.get_trials(deepcopy=False) if t.number < trial.number]
  if len(before) + 1 >= max(1, startup_trials) and all(
    'infeasible' in t.user_attrs for t in before
  ):
    raise ConfigError(f'{err} (and in each of the {len(before)} trials before it)') from None
  log.warning('trial %d pruned: its values cannot run: %s', trial.number, err)
  raise optuna.TrialPruned(f'infeasible: {err}') from None


def training_objective(
  tune: ml_collections.ConfigDict, workdir: str | pathlib.Path
) -> Callable[[optuna.Trial], float]:
  """Each trial trains `tune.base` with its sampled values in its own work
  directory, reports every validation turn to the pruner, and returns the
  best checkpoint's validation loss. A run whose loss stops being finite, or
  whose perplexity overflows, is pruned (marked `diverged`), and so are
  values the config refuses before training (marked `infeasible`: a
  parameter budget below the smallest model they describe), unless no
  trial of the study has run yet, `study.startup_trials` of them at least:
  then the error ends the study, as the base config's."""

  def objective(trial: optuna.Trial) -> float:
    _check_not_surplus(trial.study, trial, tune.study.num_trials)
    values = suggest(trial, tune.space)
    config = set_fields(tune.base, tune.space, values)
    frozen = frozen_trial(trial.study, trial.number)
    run_dir = trial_workdir(workdir, tune.study.name, frozen)
    if 'failed_trial' not in frozen.system_attrs and run_dir.exists():
      raise ConfigError(
        f'{run_dir} exists but trial {trial.number} is new: it belongs to '
        'an earlier study of this name whose database is gone. Move it '
        'away, or use another --workdir or --tune.study.name'
      )
    trial.set_user_attr('workdir', str(run_dir))
    log.info(
      'trial %d in %s: %s',
      trial.number,
      run_dir,
      ', '.join(f'{k}={v:.4g}' for k, v in values.items()),
    )

    def report(step: int, epoch: int, result) -> None:
      trial.report(result.loss, step)
      if trial.should_prune():
        raise optuna.TrialPruned(f'step {step}: valid loss {result.loss:.4f}')

    try:
      summary = train_and_evaluate(config, run_dir, on_validation=report, final_splits=('valid',))
    except TrainingError as err:
      trial.set_user_attr('diverged', str(err))
      raise optuna.TrialPruned(f'diverged: {err}') from None
    except ConfigError as err:
      if (run_dir / 'checkpoints').exists():  # it trained: not a config its values made
        raise
      _prune_infeasible(trial, tune.study.startup_trials, err)
    if not math.isfinite(summary['valid']['perplexity']):  # a loss past 709 nats
      reason = f'valid loss {summary["valid"]["loss"]:.4g} nats per token'
      trial.set_user_attr('diverged', reason)
      raise optuna.TrialPruned(f'diverged: {reason}')
    trial.set_user_attr('perplexity', summary['valid']['perplexity'])
    trial.set_user_attr('steps', summary['step'])
    trial.set_user_attr('num_params', summary['num_params'])
    trial.set_user_attr('train_seconds', summary['train_seconds'])
    return summary['valid']['loss']

  return objective


def dyneval_objective(
  tune: ml_collections.ConfigDict, data_dir: str | None = None
) -> Callable[[optuna.Trial], float]:
  """Each trial scores the first `dynamic.search_tokens` validation tokens of
  `dyneval.workdir`'s best weights with its sampled settings (the Mogrifier
  paper's Table 6) and returns that loss; a diverged setting is pruned. The
  trials share one evaluator setup: RMS statistics are estimated once, and
  a segment length compiles once."""
  from lm_zoo.runs import load_trained
  from lm_zoo.training import workdir_evaluator

  cfg = tune.dyneval
  run_config, corpus, model, params = load_trained(cfg.workdir, data_dir)
  evaluator = workdir_evaluator(cfg.workdir, run_config, cfg.evaluation, batch_size=1)
  setup = evaluator.setup(model, params, corpus)

  def objective(trial: optuna.Trial) -> float:
    _check_not_surplus(trial.study, trial, tune.study.num_trials)
    values = suggest(trial, tune.space)
    fields = {tune.space[name].field: value for name, value in values.items()}
    settings = dataclasses.replace(
      evaluator,
      **{field: (int(v) if field == 'segment_length' else v,) for field, v in fields.items()},
    ).grid()[0]
    try:
      result = evaluator.score_settings(
        setup, settings, model, params, corpus, 'valid', cfg.evaluation.dynamic.search_tokens
      )
    except TrainingError as err:
      trial.set_user_attr('diverged', str(err))
      raise optuna.TrialPruned(f'diverged: {err}') from None
    trial.set_user_attr('perplexity', result.perplexity)
    return result.loss

  return objective
