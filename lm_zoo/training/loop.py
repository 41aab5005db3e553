"""`train_and_evaluate(config, workdir, num_seeds=N)`: training with
resumable checkpoints, of one seed or of several at once.

A run trains seeds config.seed, ..., config.seed + N - 1 (N = 1 for a run
alone): its train state has a leading axis of seeds and the train step is
vmapped over it (`lm_zoo.training.seed_axis`), so every seed takes its own
update on the same window. Seed s's run is the run of one seed with
`config.seed = s`, equal up to rounding: the same initial weights, dropout
masks, windows and learning rates (each seed's schedule follows its own
validation history). On a GPU the seeds share each kernel, faster per seed
than one at a time at a recurrent model's small batch.

The run goes through phases, each a function of the `Trainer` (what the run
trains with) and the `Run` (its state; lm_zoo/training/run.py): restore or
init, train an epoch window by window, validate (lm_zoo/training/validation.py),
end an epoch, save, roll back (lm_zoo/training/checkpointing.py), finish
(lm_zoo/training/summary.py). A phase that reads back the updates
(`PendingUpdates.fetch`) returns the `RollBack` a non-finite one asks for,
and `train` restores the latest checkpoint.
"""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from lm_zoo.data import BatchedStream, Corpus, Window, load_data
from lm_zoo.evaluation import make_eval_step, split_names
from lm_zoo.models import RecurrentLM, build_model, describe_model
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.runs.nonfinite import PendingUpdates, RollBack
from lm_zoo.runs.preemption import StopRequest
from lm_zoo.runs.workdir import (
  check_workdir,
  record_command,
  record_data,
  save_config,
  save_seeds,
  workdir_lock,
)
from lm_zoo.training.budget import budget_spent, completed_summary, planned_steps, training_done
from lm_zoo.training.checkpointing import preempt, roll_back, save
from lm_zoo.training.config_checks import check_against_corpus, validate_config
from lm_zoo.training.optimizers import epoch_learning_rate, make_optimizer, set_learning_rate
from lm_zoo.training.parallel import check_batch, data_mesh, place_state, shard_batch
from lm_zoo.training.run import Progress, Run, Trainer, ValidationCallback
from lm_zoo.training.seed_axis import check_num_seeds, seed_configs, seed_dir, stack
from lm_zoo.training.state import close_checkpoints, open_checkpoints, restore_or_init
from lm_zoo.training.steps import make_train_step
from lm_zoo.training.summary import count_params, finish
from lm_zoo.training.validation import end_epoch, log_training, validate

# Progress goes to the 'lm_zoo' logger; launch scripts show its INFO lines.
log = logging.getLogger(__name__)


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str | pathlib.Path,
  on_validation: ValidationCallback | None = None,
  final_splits: Sequence[str] | None = None,
  num_seeds: int = 1,
  command: str | None = None,
) -> dict[str, Any]:
  """Trains, evaluates the best checkpoint on `final_splits`, samples text.

  Re-running with the same workdir resumes from the latest checkpoint: the
  parameters, optimizer state, recurrent state, RNG, step and data position
  are restored, so the run continues as if it had not stopped. SIGTERM or
  SIGINT during training saves a checkpoint after the current update and
  raises `Preempted` (`StopRequest`). A non-finite loss or gradient is dealt
  with as `train.nonfinite` says (stop, skip or rollback; lm_zoo/configs.py),
  seed by seed.

  With `num_seeds` = N > 1 the run trains seeds config.seed to config.seed +
  N - 1 at once: each seed's best weights, config and summary are in
  WORKDIR/seed_S (a work directory `lm-zoo-eval` and `lm_zoo.load` read),
  their metrics in WORKDIR/metrics.jsonl with a `seed` field, and
  WORKDIR/summary.json holds each split's mean and spread over the seeds.

  Args:
    config: the fields of lm_zoo/configs.py.
    workdir: where checkpoints, metrics and the summary go.
    on_validation: called after every validation turn of every seed (each
      epoch's end, and every `train.eval_every` steps) once its best
      checkpoint is saved; an exception it raises stops the run there (a
      tuner's pruner), with the checkpoints kept.
    final_splits: the splits the best weights are scored on at the end by
      the evaluator of `config.evaluation` (None: its `splits`; a tuning
      trial leaves out test).
    num_seeds: how many seeds to train at once.
    command: the command line that asked for this run, added to
      WORKDIR/commands.txt (`record_command`) once it starts or resumes
      training (None, or a finished run: nothing added).

  Returns:
    The run summary that is also written to `workdir/summary.json`.

  Raises:
    ConfigError: the config or `num_seeds` is invalid (`validate_config`),
      or does not fit the checkpoints in `workdir`.
    WorkdirInUse: another process is training in `workdir`.
    TrainingError: a non-finite loss or gradient that the policy does not
      absorb.
    Preempted: stopped by a signal, after saving a checkpoint.
  """
  validate_config(config)  # before reading data or compiling anything
  check_num_seeds(num_seeds)
  workdir = check_workdir(workdir)
  final_splits = split_names(config.evaluation.splits if final_splits is None else final_splits)
  with workdir_lock(workdir):
    return _train_and_evaluate(config, workdir, on_validation, final_splits, num_seeds, command)


def _train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: pathlib.Path,
  on_validation: ValidationCallback | None,
  final_splits: Sequence[str],
  num_seeds: int,
  command: str | None,
) -> dict[str, Any]:
  """`train_and_evaluate` once the work directory is locked."""
  started = time.perf_counter()
  corpus = load_data(config)
  check_against_corpus(config, corpus, num_seeds)
  model = build_model(config.model, len(corpus.vocab))
  optimizer = make_optimizer(config.optimizer, config.averaging.trigger)
  mesh = data_mesh(config.parallel.num_devices)
  check_batch(config.data.batch_size, mesh)
  configs = seed_configs(config, num_seeds)
  train_step = _train_step(config, model, optimizer, mesh)
  batched = BatchedStream(corpus.train, config.data.batch_size)
  checkpoints, best = open_checkpoints(workdir, configs)
  metrics = None
  try:
    state, progress, resumed = restore_or_init(
      config, workdir, checkpoints, model, optimizer, mesh, configs
    )
    summary = completed_summary(config, workdir, int(state.step[0]), progress) if resumed else None
    if summary is not None:
      return summary
    if command is not None:
      record_command(workdir, command)
    if resumed:  # (a finished run says so instead)
      where = (int(state.step[0]), progress.epoch, progress.position, workdir)
      log.info('Resumed from step %d (epoch %d, position %d) in %s', *where)
    metrics = _open_records(config, workdir, corpus, configs, state, progress, resumed)
    trainer = Trainer(
      config=config,
      workdir=workdir,
      configs=configs,
      corpus=corpus,
      model=model,
      mesh=mesh,
      train_step=train_step,
      eval_step=make_eval_step(model),
      stacked_eval_step=make_eval_step(model, stacked=True),
      batched=batched,
      total_steps=planned_steps(config, batched),
      checkpoints=checkpoints,
      best=best,
      metrics=metrics,
      on_validation=on_validation,
      started=started,
    )
    run = start_run(trainer, state, progress)
    train(trainer, run)
    return finish(trainer, run, final_splits)
  finally:  # also when on_validation or a fault stops the run
    close_checkpoints(checkpoints, best)
    if metrics is not None:
      metrics.close()


def _train_step(
  config: ml_collections.ConfigDict,
  model: RecurrentLM,
  optimizer: optax.GradientTransformation,
  mesh: Mesh | None,
) -> Callable:
  """The jitted train step `config` asks for, over the seed axis."""
  return make_train_step(
    model,
    optimizer,
    config.optimizer.loss_reduction == 'sum_over_time',
    config.optimizer.ar,
    config.optimizer.tar,
    mesh,
    skip_nonfinite=config.train.nonfinite == 'skip',
    drop_state=config.train.drop_state,
    stacked=True,
    hold_padding=window_multiple(config.data) > 1,
  )


def _open_records(
  config: ml_collections.ConfigDict,
  workdir: pathlib.Path,
  corpus: Corpus,
  configs: Sequence[ml_collections.ConfigDict],
  state: Any,
  progress: Progress,
  resumed: bool,
) -> MetricsWriter:
  """Writes the run's config and data record (a run of several seeds: also
  its seeds, and each seed's in WORKDIR/seed_S) and opens its metrics with
  the hyperparameters, keeping what the run had logged at its checkpoint."""
  save_config(config, workdir)
  record_data(corpus, workdir)
  if len(configs) > 1:
    save_seeds(workdir, [c.seed for c in configs])
    for seeded in configs:
      save_config(seeded, seed_dir(workdir, seeded.seed))
      record_data(corpus, seed_dir(workdir, seeded.seed))
  metrics = MetricsWriter(
    workdir,
    keep=progress.metrics_records if resumed else 0,  # a new run: nothing
    resume_step=int(state.step[0]) if resumed else None,
  )
  metrics.hyperparameters(config)
  return metrics


def start_run(t: Trainer, state: Any, progress: Progress) -> Run:
  """The run, from `state` laid out over the mesh (`restore_or_init`)."""
  if t.mesh is not None:
    log.info(
      'Data parallel over %d devices: %d rows each',
      t.mesh.size,
      t.config.data.batch_size // t.mesh.size,
    )
  if t.num_seeds > 1:
    log.info('Training seeds %s at once', ', '.join(str(c.seed) for c in t.configs))
  log.info(
    'Model: %s; %s parameters%s; train %s tokens, vocab %d',
    describe_model(t.config.model, t.model),
    f'{count_params(state):,}',
    ' each' if t.num_seeds > 1 else '',
    f'{len(t.corpus.train):,}',
    len(t.corpus.vocab),
  )
  seeds = [c.seed for c in t.configs] if t.num_seeds > 1 else None
  updates = PendingUpdates(t.config.train, t.metrics, t.workdir, t.checkpoints.has_latest, seeds)
  return Run(
    state,
    progress,
    updates,
    step=int(state.step[0]),
    trained_before=progress.train_seconds,
    tokens_before=progress.train_tokens,
  )


def train(t: Trainer, run: Run) -> None:
  """Trains until the epochs or a budget (train.max_steps, train.max_seconds)
  run out, rolling back where a non-finite update asks for it."""
  if t.config.train.nonfinite == 'rollback' and not t.checkpoints.has_latest():
    save(t, run)  # a finite state to roll back to before the first checkpoint
  with StopRequest() as stop:
    while not training_done(t.config, run.progress, run.step, run.seconds_trained()):
      fault = train_epoch(t, run, stop)
      if fault is not None:
        roll_back(t, run, fault)


def epoch_rates(t: Trainer, progress: Progress) -> np.ndarray:
  """Each seed's learning rate for the epoch: its schedule's, from its own
  validation history, lowered for each of its rollbacks."""
  cfg = t.config
  return np.asarray(
    [
      epoch_learning_rate(cfg.schedule, cfg.optimizer.learning_rate, progress.epoch, losses)
      * cfg.train.rollback_lr_factor**rollbacks
      for losses, rollbacks in zip(progress.valid_losses, progress.rollbacks)
    ]
  )


def window_multiple(data: ml_collections.ConfigDict) -> int:
  """The multiple training pads its windows to: `pad_windows_to` for
  variable windows (the train step then holds the state past their own
  steps), else 1 (fixed windows have one length)."""
  return data.pad_windows_to if data.variable_bptt else 1


def train_epoch(t: Trainer, run: Run, stop: StopRequest) -> RollBack | None:
  """Trains on the epoch's windows from `progress.position` to its end (then
  validates) or to a budget or a signal's stop, and checkpoints. Returns the
  rollback a non-finite update asks for."""
  data, progress = t.config.data, run.progress
  rates = epoch_rates(t, progress)
  if progress.position == 0:
    # Placed as the steps leave them: fresh host zeros would be another input
    # layout, and the train step would compile again at every epoch.
    carries = stack([t.model.initialize_carry(data.batch_size)] * t.num_seeds)
    run.state = place_state(run.state.replace(carries=carries), t.mesh, seed_axis=True)
  # One draw of window lengths for every seed: config.seed's. Variable windows
  # are padded to few shapes, past which the train step holds the state; the
  # last window is padded to bptt (its state is not carried into the next epoch).
  for window in t.batched.windows(
    data.bptt,
    progress.position,
    data.variable_bptt,
    seed=(t.config.seed, progress.epoch),
    pad_last=True,
    multiple=window_multiple(data),
  ):
    train_window(t, run, window, rates)
    stopping = budget_spent(t.config, run.step, run.seconds_trained())
    fault = after_update(t, run, rates, stopping, stop)
    if fault is not None:
      return fault
    if stopping:
      break
  if progress.position >= t.batched.row_length:
    fault = run.updates.fetch(progress).rollback  # validate finite weights only
    if fault is not None:
      return fault
    end_epoch(t, run)
  return save(t, run)  # which leaves the validation and the save out of the next rate


def train_window(t: Trainer, run: Run, window: Window, rates: np.ndarray) -> None:
  """One update of every seed on `window`, at each seed's epoch rate."""
  data = t.config.data
  sum_over_time = t.config.optimizer.loss_reduction == 'sum_over_time'
  # AWD-LSTM scales a window's learning rate by its length / bptt; a loss
  # summed over time already grows with the length.
  scale = window.length / data.bptt if data.variable_bptt and not sum_over_time else 1.0
  step_lr = tuple(float(rate * scale) for rate in rates)
  if step_lr != run.step_lr:  # no host-to-device copy while the rates hold
    run.step_lr = step_lr
    run.state = run.state.replace(
      opt_state=set_learning_rate(run.state.opt_state, np.asarray(step_lr, np.float32))
    )
  run.state, step_metrics = t.train_step(
    run.state, *shard_batch(t.mesh, window.inputs, window.targets, window.weights)
  )
  run.progress.position = window.start + window.length
  run.step += 1
  run.updates.add(run.step, step_metrics)
  tokens = window.length * window.inputs.shape[0] * t.num_seeds
  run.throughput.add(tokens)
  run.tokens_trained += tokens


def after_update(
  t: Trainer, run: Run, rates: np.ndarray, stopping: bool, stop: StopRequest
) -> RollBack | None:
  """What is due after an update, in turn: a log line, a validation turn, a
  checkpoint, the stop a signal asks for. Each reads back the pending updates
  first, so none sees non-finite weights; a rollback ends the turn."""
  cfg, progress = t.config.train, run.progress
  if run.step % cfg.log_every == 0:
    fault = log_training(t, run, rates)
    if fault is not None:
      return fault
  # A turn every eval_every steps, and one for the weights a budget stops at
  # (the epoch end validates anyway); before the checkpoint, so that a
  # resumed run knows its best score.
  if (
    cfg.eval_every > 0
    and progress.position < t.batched.row_length
    and (run.step % cfg.eval_every == 0 or stopping)
  ):
    fault = run.updates.fetch(progress).rollback
    if fault is not None:
      return fault
    validate(t, run, f'epoch {progress.epoch} step {run.step}')
    run.throughput.reset()
  if cfg.checkpoint_every > 0 and run.step % cfg.checkpoint_every == 0:
    fault = save(t, run)
    if fault is not None:
      return fault
  signum = stop.requested(run.step)
  if signum is not None:
    return preempt(t, run, signum)
  return None
