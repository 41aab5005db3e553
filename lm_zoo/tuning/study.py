"""Tuning studies on Optuna: each trial a real training run (or a dynamic
evaluation of a trained model), studies kept in a relational database so
that workers on many hosts can share one.

A tuning config (`experiments/tune_*.py`) has these sections:

  kind:    'train' (each trial trains `base` with the sampled values) or
           'dyneval' (each trial scores `dyneval.workdir`'s model on
           validation data with the sampled dynamic-evaluation settings).
  space:   the hyper-parameters (lm_zoo.tuning.spaces).
  base:    the training config every trial starts from (kind 'train'); its
           train.max_steps / train.max_seconds are each trial's budget and its
           train.eval_every how often the pruner sees the validation loss.
  dyneval: workdir and evaluation (kind 'dyneval'), an evaluation config
           whose 'dynamic' evaluator each trial runs with its sampled values.
  study:   num_trials (in total, over every worker), sampler (tpe | random),
           seed (-1: random per worker), pruner (median | hyperband | halving
           | none), pruner_startup_trials, pruner_warmup_steps,
           heartbeat_interval / grace_period (seconds: a worker silent that
           long has died, and its trial is failed and retried) and max_retry.

A trial's objective is the validation loss (nats per token) of its best
checkpoint; lower is better.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import pathlib
import time
import urllib.parse
import warnings

import ml_collections
import numpy as np
import optuna
import sqlalchemy

from lm_zoo.errors import ConfigError, Preempted, is_whole_number
from lm_zoo.evaluation import build_evaluator
from lm_zoo.runs.workdir import refuse_links
from lm_zoo.training.config_checks import validate_config
from lm_zoo.tuning.objectives import (
  SurplusTrial,
  dyneval_objective,
  frozen_trial,
  training_objective,
)
from lm_zoo.tuning.spaces import check_space, set_fields

log = logging.getLogger(__name__)

KINDS = ('train', 'dyneval')
SAMPLERS = ('tpe', 'random')
PRUNERS = ('median', 'hyperband', 'halving', 'none')
# What a kind 'dyneval' space may set: fields of the 'dynamic' evaluator, whose
# config value stands where the space sets none.
DYNEVAL_FIELDS = ('learning_rate', 'decay', 'eps', 'segment_length')
STUDY_FILE = 'study.db'
# Trials still to be settled: they may yet finish, or fail and be retried.
_UNSETTLED = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


class _Interrupted(Exception):
  """A signal stopped the trial's training (after its checkpoint): the worker
  queues it again once Optuna has marked it failed, then stops."""


def storage_url(tune: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> str:
  """The study's database: `study.storage`, else SQLite in `workdir`."""
  if tune.study.storage:
    return tune.study.storage
  # Quoted: SQLAlchemy reads a '?' in the path as the start of the URL's query
  # (a database outside the work directory) and unquotes what it reads.
  return f'sqlite:///{urllib.parse.quote(str((pathlib.Path(workdir) / STUDY_FILE).resolve()))}'


@contextlib.contextmanager
def _experimental_apis():
  """Optuna marks the heartbeat's retry and stale-trial functions experimental
  (since 2.8 and 2.9); we rely on them knowingly, without a warning per trial."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', optuna.exceptions.ExperimentalWarning)
    yield


def _storage(tune: ml_collections.ConfigDict, url: str) -> optuna.storages.RDBStorage:
  # SQLite serialises writers: wait for a lock instead of failing at once.
  engine_kwargs = {'connect_args': {'timeout': 60}} if url.startswith('sqlite') else {}
  with _experimental_apis():
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=tune.study.max_retry)
    return optuna.storages.RDBStorage(
      url,
      engine_kwargs=engine_kwargs,
      heartbeat_interval=tune.study.heartbeat_interval,
      grace_period=tune.study.grace_period,
      heartbeat_stale_trial_callback=retry,
    )


def _sampler(
  study_cfg: ml_collections.ConfigDict, worker: int, trials_before: int = 0
) -> optuna.samplers.BaseSampler:
  """The study's sampler for one worker. A seeded one draws from (seed,
  worker, the trials the study already holds): the same study again from an
  empty database samples the same values, and a worker restarted on a study
  samples on where it stopped instead of repeating its first values."""
  seed = (
    None
    if study_cfg.seed < 0
    else int(np.random.SeedSequence([study_cfg.seed, worker, trials_before]).generate_state(1)[0])
  )
  if study_cfg.sampler == 'tpe':
    # constant_liar: running trials count as bad, so parallel workers spread out.
    return optuna.samplers.TPESampler(
      seed=seed, constant_liar=True, n_startup_trials=study_cfg.startup_trials
    )
  return optuna.samplers.RandomSampler(seed=seed)


def _pruner(
  study_cfg: ml_collections.ConfigDict, max_steps: int, eval_every: int
) -> optuna.pruners.BasePruner:
  # Hyperband and halving rungs start at the first step a trial reports.
  first_report = max(study_cfg.pruner_warmup_steps, eval_every, 1)
  if study_cfg.pruner == 'median':
    return optuna.pruners.MedianPruner(
      n_startup_trials=study_cfg.pruner_startup_trials, n_warmup_steps=study_cfg.pruner_warmup_steps
    )
  if study_cfg.pruner == 'hyperband':
    return optuna.pruners.HyperbandPruner(
      min_resource=first_report, max_resource=max_steps if max_steps > 0 else 'auto'
    )
  if study_cfg.pruner == 'halving':
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=first_report)
  return optuna.pruners.NopPruner()


def _identity(tune: ml_collections.ConfigDict) -> str:
  """What workers of one study must agree on: the kind, space, base config
  and dynamic-evaluation settings."""
  return json.dumps(
    {
      'kind': tune.kind,
      **{f: json.loads(tune[f].to_json_best_effort()) for f in ('space', 'base', 'dyneval')},
    },
    sort_keys=True,
  )


def validate_tuning(tune: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for a tuning config that cannot run."""
  missing = [name for name in ('kind', 'study', 'space', 'base') if name not in tune]
  if missing:
    raise ConfigError(
      f'--tune is not a tuning config: it has no {", ".join(missing)} (a '
      'training config?); give an experiments/tune_*.py file'
    )
  for name in ('heartbeat_interval', 'grace_period'):
    if not (is_whole_number(tune.study[name]) and tune.study[name] >= 1):
      raise ConfigError(
        f'tune.study.{name}={tune.study[name]!r} must be a whole number of seconds, at least 1'
      )
  if tune.study.max_retry < 0:
    raise ConfigError(f'tune.study.max_retry={tune.study.max_retry} must be >= 0')
  for field, names in (('kind', KINDS), ('study.sampler', SAMPLERS), ('study.pruner', PRUNERS)):
    section, _, name = field.rpartition('.')
    value = tune[section][name] if section else tune[name]
    if value not in names:
      raise ConfigError(f'tune.{field}={value!r} is not known: choose one of {", ".join(names)}')
  if tune.kind == 'dyneval' and not tune.dyneval.workdir:
    raise ConfigError('tune.dyneval.workdir must name a trained work directory')
  check_space(tune.space)
  if tune.kind == 'train':
    # Each field must exist, and the base config run at either end of every
    # range: else each trial would be pruned for it. What only the data
    # decides (a budget against the vocabulary) prunes the trials it hits.
    for end in ('low', 'high'):
      values = {name: getattr(spec, end) for name, spec in tune.space.items()}
      validate_config(set_fields(tune.base, tune.space, values))
  else:
    if tune.dyneval.evaluation.evaluator != 'dynamic':
      raise ConfigError(
        "tune.dyneval.evaluation.evaluator must be 'dynamic', got "
        f'{tune.dyneval.evaluation.evaluator!r}'
      )
    build_evaluator(tune.dyneval.evaluation, bptt=1, batch_size=1)  # checks its fields
    for name, spec in tune.space.items():
      if spec.field not in DYNEVAL_FIELDS:
        raise ConfigError(
          f'tune.space.{name} sets {spec.field}, which is not a dynamic '
          f'evaluation setting: choose one of {", ".join(DYNEVAL_FIELDS)}'
        )
  if tune.study.num_trials < 1:
    raise ConfigError(f'tune.study.num_trials must be at least 1, got {tune.study.num_trials}')


def _create_or_load(tune: ml_collections.ConfigDict, url: str, worker: int) -> optuna.Study:
  """The study in the database at `url`, created if it is not there yet.

  Raises ConfigError for a database that cannot be opened or read.
  """
  budget = (
    (tune.base.train.max_steps, tune.base.train.eval_every) if tune.kind == 'train' else (0, 0)
  )
  for attempt in range(5):
    try:
      return optuna.create_study(
        study_name=tune.study.name,
        storage=_storage(tune, url),
        direction='minimize',
        sampler=_sampler(tune.study, worker),
        pruner=_pruner(tune.study, *budget),
        load_if_exists=True,
      )
    except ImportError as err:  # a PostgreSQL or MySQL driver
      raise ConfigError(
        f'the study database {url} needs a driver that is not installed ({err})'
      ) from None
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as err:
      raise ConfigError(
        f'tune.study.storage={url!r} is not a database URL SQLAlchemy can '
        f'open ({str(err).splitlines()[0]}): give sqlite:///PATH or '
        'postgresql://USER@HOST/NAME'
      ) from None
    except sqlalchemy.exc.DBAPIError as err:
      if attempt == 4 or not _lost_creation_race(err):
        raise ConfigError(
          f'the study database {url} cannot be read ('
          f'{str(err.orig).splitlines()[0]}): restore it, or start the study '
          'in a new --workdir or database'
        ) from None
      time.sleep(1 + attempt)


def _lost_creation_race(err: sqlalchemy.exc.DBAPIError) -> bool:
  """Whether `err` is a worker's lost race to create the study's tables and
  record the schema version (PostgreSQL: a type or table the other created,
  'already exists'): it finds them made on its next try."""
  return isinstance(err, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError)) or (
    isinstance(err, sqlalchemy.exc.ProgrammingError) and 'already exists' in str(err)
  )


def open_study(
  tune: ml_collections.ConfigDict, workdir: str | pathlib.Path, worker: int = 0
) -> optuna.Study:
  """The study `tune` describes, created or joined in its database.

  Raises ConfigError when the database holds a study of that name with
  another search space, base config or kind, or `workdir` a symbolic link
  (to a database elsewhere: name it by `study.storage`).
  """
  validate_tuning(tune)
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  refuse_links(workdir)
  url = storage_url(tune, workdir)
  study = _create_or_load(tune, url, worker)
  study.sampler = _sampler(tune.study, worker, len(study.get_trials(deepcopy=False)))
  identity = study.user_attrs.get('tune_config')
  if identity is None:
    study.set_user_attr('tune_config', _identity(tune))
  elif identity != _identity(tune):
    raise ConfigError(
      f'the study {tune.study.name!r} in {url} was started with another '
      'search space, base config or kind: use the same tuning config, '
      'or another --tune.study.name'
    )
  return study


def _retry(study: optuna.Study, trial: optuna.trial.FrozenTrial, max_retry: int | None) -> None:
  """Queues `trial` again, as the heartbeat does for a worker that died."""
  with _experimental_apis():
    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)(study, trial)


def study_counts(study: optuna.Study) -> dict[str, int]:
  """Trials by state: finished (complete or pruned), unsettled (running or
  waiting) and failed."""
  trials = study.get_trials(deepcopy=False)
  return {
    'finished': sum(t.state in FINISHED for t in trials),
    'complete': sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials),
    'pruned': sum(t.state == optuna.trial.TrialState.PRUNED for t in trials),
    'unsettled': sum(t.state in _UNSETTLED for t in trials),
    'waiting': sum(t.state == optuna.trial.TrialState.WAITING for t in trials),
    'failed': sum(t.state == optuna.trial.TrialState.FAIL for t in trials),
    'surplus': sum(bool(t.user_attrs.get('surplus')) for t in trials),
  }


def run_worker(
  tune: ml_collections.ConfigDict,
  workdir: str | pathlib.Path,
  worker: int = 0,
  timeout: float = 0.0,
  data_dir: str | None = None,
) -> optuna.Study:
  """Runs trials of the study until it has `study.num_trials` finished ones
  (over every worker sharing its database), or for `timeout` seconds when
  > 0. Start as many workers as there are machines, with the same tuning
  config and database; give each its own `worker` number when the sampler
  is seeded, so they sample differently.

  A worker whose remaining trials are all running elsewhere waits for them:
  one may belong to a worker that died, and is retried once its heartbeat is
  `study.grace_period` seconds old. `data_dir`: where a dyneval study's
  model's data is now, if not where its run recorded.
  """
  if not timeout >= 0:
    raise ConfigError(f'timeout must be >= 0 seconds (0: none), got {timeout}')
  study = open_study(tune, workdir, worker)
  objective = (
    training_objective(tune, workdir) if tune.kind == 'train' else dyneval_objective(tune, data_dir)
  )
  interrupted = []  # (trial number, Preempted)

  def run_one(trial: optuna.Trial) -> float:
    try:
      return objective(trial)
    except Preempted as err:
      interrupted.append((trial.number, err))
      raise _Interrupted(str(err)) from err

  start, poll = time.monotonic(), max(1, min(tune.study.heartbeat_interval, 10))
  while not timeout or time.monotonic() - start < timeout:
    with _experimental_apis():  # a dead worker's trial: failed, and queued again
      optuna.storages.fail_stale_trials(study)
    counts = study_counts(study)
    if counts['finished'] >= tune.study.num_trials:
      break
    if counts['finished'] + counts['unsettled'] >= tune.study.num_trials and not counts['waiting']:
      time.sleep(poll)
      continue
    study.optimize(run_one, n_trials=1, catch=(SurplusTrial, _Interrupted))
    if interrupted:
      # Queued only now that the trial is failed: a worker that picked the copy
      # up while the original still ran would count the original ahead of it.
      number, preempted = interrupted[0]
      _retry(study, frozen_trial(study, number), tune.study.max_retry)
      raise preempted
  log.info('worker %d done: %s', worker, study_counts(study))
  return study


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
  completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
  finite = [t for t in completed if math.isfinite(t.value)]
  return min(finite, key=lambda t: t.value) if finite else None
