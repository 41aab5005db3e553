"""The learned update rule (Wolf et al. 2018) meta-trained for a finished
run's best weights (`meta_train_workdir`) and saved beside them, resumed
from its progress after a stop."""

from __future__ import annotations

import logging
import pathlib
import shutil
import signal
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm_zoo.errors import ConfigError, LMZooError, Preempted
from lm_zoo.evaluation import MetaTrainState, diagonal_fisher, meta_train
from lm_zoo.evaluation.checks import check_whole
from lm_zoo.optim import DECAY_MEANS, NUM_FEATURES, mean_rms
from lm_zoo.presets import is_preset
from lm_zoo.remote import is_remote
from lm_zoo.runs.checkpoints import restore_tree
from lm_zoo.runs.finished import load_trained
from lm_zoo.runs.preemption import StopRequest
from lm_zoo.runs.workdir import refuse_links
from lm_zoo.training.evaluation_progress import progress_digest
from lm_zoo.training.meta_learner import (
  META_LEARNER_DIR,
  PRIORS,
  gate_network,
  load_progress,
  progress_folder,
  save_meta_learner,
  save_progress,
)

log = logging.getLogger(__name__)


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
  or SIGINT (which then raise Preempted) to OUTPUT/progress; the same call
  resumes from it, and it is removed once the rule is saved. Called again
  once the rule is saved, it returns that rule's losses.
  """
  _check_meta_training_config(config)
  output = _meta_learner_output(workdir, config.output)
  run_config, corpus, model, params = load_trained(workdir, data_dir)
  digest = progress_digest(
    config, run_config, params, corpus.fingerprint(), leave_out=_NOT_IN_PROGRESS
  )
  done = _finished_rule(output, digest)
  if done is not None:
    return done
  precision, meta, net, meta_params = _gate_start(config, run_config, corpus, model, params)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(config.meta_learning_rate))
  progress = progress_folder(output)
  start = _kept_progress(progress, digest, config, model, params, meta_params, optimizer)
  fields = ('num_updates', 'segment_length', 'batch_size', 'seed', 'first_order', 'log_every')
  with StopRequest() as stop:
    result = meta_train(
      model,
      net.apply,
      meta_params,
      params,
      precision,
      corpus.train,
      config.meta_steps,
      optimizer=optimizer,
      carry_over=config.carry_over,
      start=start,
      after_step=lambda state: _keep_progress(state, config, progress, digest, stop),
      **{field: config[field] for field in fields},
    )
  meta = {**meta, **_training_meta(config, result.losses), 'digest': digest}
  save_meta_learner(output, result.meta_params, precision, meta)
  shutil.rmtree(progress, ignore_errors=True)
  return result.losses


def _finished_rule(output: pathlib.Path, digest: str) -> np.ndarray | None:
  """The losses of the rule in `output` if it was meta-trained as this one
  would be (the same `digest`), else None."""
  try:
    saved = restore_tree(output)
  except LMZooError:  # damaged: meta-training replaces it
    return None
  if saved is None or saved[1].get('digest') != digest:
    return None
  log.info("%s holds this meta-training's rule already: not meta-trained again", output)
  return np.asarray(saved[1]['losses'], np.float64)


def _kept_progress(
  folder: pathlib.Path, digest: str, config, model, params, meta_params, optimizer
) -> MetaTrainState | None:
  """The progress of this meta-training (`digest`) kept in `folder`, or None."""
  carries = model.initialize_carry(config.batch_size)
  like = MetaTrainState(0, meta_params, optimizer.init(meta_params), params, carries, [])
  return load_progress(folder, like, digest)


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
