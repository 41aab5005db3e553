"""A finished run's best weights (`lm_zoo.runs.finished.load_trained`) scored
by any evaluator (`evaluate_workdir`), and the learned update rule
meta-trained for them (`meta_train_workdir`)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm_zoo.configs import evaluation_config
from lm_zoo.errors import ConfigError, Preempted, TrainingError
from lm_zoo.evaluation import (
  EvalResult,
  Evaluator,
  MetaTrainState,
  build_evaluator,
  diagonal_fisher,
  meta_train,
  needs_meta_learner,
  split_names,
)
from lm_zoo.evaluation.checks import check_whole
from lm_zoo.optim import DECAY_MEANS, NUM_FEATURES, mean_rms
from lm_zoo.presets import is_preset
from lm_zoo.remote import is_remote, resolve
from lm_zoo.runs.finished import load_trained
from lm_zoo.runs.preemption import StopRequest
from lm_zoo.runs.workdir import refuse_links
from lm_zoo.training.evaluation_progress import MISSING, EvaluationProgress, progress_digest
from lm_zoo.training.meta_learner import (
  META_LEARNER_DIR,
  PRIORS,
  gate_network,
  load_meta_learner,
  load_progress,
  progress_folder,
  save_meta_learner,
  save_progress,
)


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
) -> dict[str, EvalResult]:
  """The best checkpoint of a work directory scored on `config.splits` by
  the evaluator `config` names (`lm_zoo.configs.evaluation_config`; default:
  static evaluation of valid and test at the run's test batch size), on the
  run's data (`data_dir`: where it is now, if not where the run recorded).

  With `progress` (a folder), the evaluator's choice and each split's result
  are kept there as they are made (`EvaluationProgress`), under a digest of
  the config, the weights and the data; the same evaluation stopped and
  started again resumes from them, and they are removed once every split is
  scored."""
  config, splits = _checked_evaluation(config)
  run_config, corpus, model, params = load_trained(workdir, data_dir)
  evaluator = workdir_evaluator(workdir, run_config, config)
  if progress is None:
    prepared = evaluator.prepare(model, params, corpus)
    return {split: evaluator.score(prepared, split) for split in splits}
  meta_learner = getattr(evaluator, 'meta_learner', None)
  kept = EvaluationProgress.of(
    progress,
    config.evaluator,
    config,
    run_config,
    params,
    corpus,
    None if meta_learner is None else meta_learner.meta_params,
  )
  results = {split: kept.result(split) for split in splits}
  if None in results.values():
    record = kept.choice()
    if record is MISSING:
      prepared = evaluator.prepare(model, params, corpus)
      kept.save_choice(evaluator.choice_record(prepared))
    else:
      prepared = evaluator.prepare_from(model, params, corpus, record)
    for split in (s for s, result in results.items() if result is None):
      results[split] = evaluator.score(prepared, split)
      kept.save_result(split, results[split])
  kept.clear()
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


def meta_train_workdir(
  workdir: str | pathlib.Path, config: ml_collections.ConfigDict, data_dir: str | None = None
) -> np.ndarray:
  """Meta-trains the learned update rule (Wolf et al. 2018) for a work
  directory's best weights on its training split, as `config` says
  (`lm_zoo.configs.meta_training_config`), and saves it to
  `config.output` (default WORKDIR/meta_learner) for the 'learned'
  evaluator. A preset stays as it was exported: its rule needs an `output`.

  theta_0's precision is the diagonal Fisher of `fisher_batches` training
  windows of `fisher_batch_size` rows. The gate network (`hidden` units)
  starts as the `prior` rule: 'sgd', SGD with step `initial_learning_rate`
  and a decay toward theta_0 of `initial_decay` per update (`GateNetwork`,
  `decay_logits`), or 'rms', RMS dynamic evaluation with that learning
  rate, decay and `initial_eps`, its MS the square root of the Fisher and
  its mean(MS) over `decay_mean` (`RMSGateNetwork`). Each of `meta_steps`
  Adam steps (`meta_learning_rate`) backpropagates through `num_updates`
  updates of `segment_length` tokens at `batch_size` stream positions, from
  the trained weights at random positions or, with `carry_over`, continuing
  along the stream (`lm_zoo.evaluation.meta_train`). Returns L_meta / K per
  meta-step.

  Its progress is saved every `checkpoint_every` meta-steps and on SIGTERM
  or SIGINT (which then raise Preempted) to OUTPUT.progress; the same call
  resumes from it, and it is removed once the rule is saved.
  """
  _check_meta_training_config(config)
  output = _meta_learner_output(workdir, config.output)
  run_config, corpus, model, params = load_trained(workdir, data_dir)
  precision, meta, net, meta_params = _gate_start(config, run_config, corpus, model, params)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(config.meta_learning_rate))
  progress = progress_folder(output)
  start, digest = _kept_progress(
    progress, config, run_config, corpus, model, params, meta_params, optimizer
  )
  with StopRequest() as stop:
    result = meta_train(
      model,
      net.apply,
      meta_params,
      params,
      precision,
      corpus.train,
      config.meta_steps,
      config.num_updates,
      config.segment_length,
      config.batch_size,
      optimizer,
      config.seed,
      first_order=config.first_order,
      log_every=config.log_every,
      carry_over=config.carry_over,
      start=start,
      after_step=lambda state: _keep_progress(state, config, progress, digest, stop),
    )
  save_meta_learner(
    output, result.meta_params, precision, {**meta, **_training_meta(config, result.losses)}
  )
  shutil.rmtree(progress, ignore_errors=True)
  return result.losses


def _kept_progress(
  folder: pathlib.Path, config, run_config, corpus, model, params, meta_params, optimizer
) -> tuple[MetaTrainState | None, str]:
  """(The progress of this meta-training kept in `folder`, or None; the
  digest of what it depends on: the config, the run, the weights, the data)."""
  digest = progress_digest(
    config, run_config, params, corpus.fingerprint(), leave_out=_NOT_IN_PROGRESS
  )
  like = MetaTrainState(
    0,
    meta_params,
    optimizer.init(meta_params),
    params,
    model.initialize_carry(config.batch_size),
    [],
  )
  return load_progress(folder, like, digest), digest


# What meta-training's progress does not depend on.
_NOT_IN_PROGRESS = ('evaluation', 'log_every', 'output', 'checkpoint_every')


def _keep_progress(
  state: MetaTrainState, config, folder: pathlib.Path, digest: str, stop: StopRequest
) -> None:
  """Saves meta-training's progress every `checkpoint_every` meta-steps and
  on a signal, after which it raises Preempted."""
  signum = stop.requested(state.step)
  if signum is not None or state.step % config.checkpoint_every == 0:
    save_progress(folder, state, digest)
  if signum is not None:
    raise Preempted(
      f'{signal.Signals(signum).name} received: meta-training stopped after meta-step '
      f'{state.step} of {config.meta_steps}, its progress kept in {folder}; run the same '
      'command to resume',
      signum,
    )


def _gate_start(config, run_config, corpus, model, params) -> tuple[Any, dict, Any, Any]:
  """(theta_0's precision, the diagonal Fisher; the gate network's
  description, `_gate_meta`; the network; its initial meta-parameters)."""
  precision = diagonal_fisher(
    model,
    params,
    corpus.train,
    config.fisher_batch_size,
    run_config.data.bptt,
    config.fisher_batches,
  )
  meta = _gate_meta(config, precision)
  net = gate_network(meta)
  return precision, meta, net, net.init(jax.random.key(config.seed), jnp.zeros((1, NUM_FEATURES)))


def _gate_meta(config: ml_collections.ConfigDict, precision: Any) -> dict[str, Any]:
  """What `gate_network` builds the gate network from: the prior rule and
  its initial settings, and for 'rms' the mean(MS) of theta_0's `precision`
  (the diagonal Fisher) over `decay_mean`."""
  meta = {
    'prior': config.prior,
    'hidden': config.hidden,
    'initial_learning_rate': config.initial_learning_rate,
    'initial_decay': config.initial_decay,
    'initial_eps': config.initial_eps,
  }
  if config.prior == 'rms':
    meta.update(mean_ms=mean_rms(precision, config.decay_mean), decay_mean=config.decay_mean)
  return meta


def _training_meta(config: ml_collections.ConfigDict, losses: np.ndarray) -> dict[str, Any]:
  """How the rule was meta-trained, and its L_meta / K per meta-step,
  saved with it beside the gate network's settings."""
  return {
    'segment_length': config.segment_length,
    'num_updates': config.num_updates,
    'batch_size': config.batch_size,
    'meta_steps': config.meta_steps,
    'meta_learning_rate': config.meta_learning_rate,
    'first_order': config.first_order,
    'carry_over': config.carry_over,
    'seed': config.seed,
    'losses': [float(x) for x in losses],
  }


def _meta_learner_output(workdir: str | pathlib.Path, output: str) -> pathlib.Path:
  """Where meta-training saves the rule: `output`, else WORKDIR/meta_learner
  of a work directory with no symbolic link inside (`refuse_links`: the rule
  would be written through it); a preset's folder is not written to."""
  if output:
    return pathlib.Path(output)
  if is_remote(workdir) or is_preset(workdir):
    raise ConfigError(
      f'{workdir} is a preset, kept as it was exported: name the folder '
      'the rule goes to with --config.output=FOLDER (and score with lm-zoo-eval '
      '--config=experiments/evaluate.py:learned --config.learned.meta_learner=FOLDER)'
    )
  refuse_links(pathlib.Path(workdir))
  return pathlib.Path(workdir) / META_LEARNER_DIR


def _check_meta_training_config(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError, naming the field, where `config` is no meta-training
  config or holds a size or choice it cannot run."""
  if 'prior' not in config:
    raise ConfigError(
      'the config is not a meta-training config (it has no prior): give '
      'experiments/dyneval_learned.py or another of meta_training_config()'
    )
  for field in (
    'meta_steps',
    'num_updates',
    'segment_length',
    'batch_size',
    'hidden',
    'fisher_batches',
    'fisher_batch_size',
    'checkpoint_every',
  ):
    check_whole(config[field], field, int(field != 'meta_steps'))
  if config.prior not in PRIORS:
    raise ConfigError(f'prior must be one of {", ".join(PRIORS)}, got {config.prior!r}')
  if config.decay_mean not in DECAY_MEANS:
    raise ConfigError(
      f'decay_mean must be one of {", ".join(DECAY_MEANS)}, got {config.decay_mean!r}'
    )
