"""`train_and_evaluate(config, workdir)`: training with resumable checkpoints.

The run goes through phases, each a function of the `Trainer` (what the run
trains with) and the `Run` (its state; lm_zoo/training/run.py): restore or
init, train an epoch window by window, validate, end an epoch, roll back,
save, finish. A phase that reads back the updates (`PendingUpdates.fetch`)
returns the `RollBack` a non-finite one asks for, and `train` restores the
latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import signal
import time
from typing import Any, Sequence

import ml_collections
import optax
from jax.sharding import Mesh

from lm_zoo.data import BatchedStream, Window
from lm_zoo.errors import Preempted
from lm_zoo.models import RecurrentLM, build_model, describe_model
from lm_zoo.evaluation import EvalResult, make_eval_step, split_names
from lm_zoo.optim import averaged_params, start_averaging
from lm_zoo.training.averaging import patience_reached, should_start_averaging
from lm_zoo.training.budget import budget_spent, completed_summary, planned_steps, training_done
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.training.config_checks import validate_config
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.runs.nonfinite import PendingUpdates, RollBack
from lm_zoo.training.optimizers import epoch_learning_rate, make_optimizer, set_learning_rate
from lm_zoo.training.parallel import check_batch, data_mesh, place_state, shard_batch
from lm_zoo.runs.preemption import StopRequest
from lm_zoo.data import load_data
from lm_zoo.training.run import Progress, Run, Trainer, ValidationCallback, create_train_state
from lm_zoo.training.scoring import score_split
from lm_zoo.training.steps import TrainState, make_train_step
from lm_zoo.training.summary import count_params, finish
from lm_zoo.runs.finished import initial_params
from lm_zoo.runs.workdir import (check_resumable, check_workdir, record_data, save_config,
                                 workdir_lock)

# Progress goes to the 'lm_zoo' logger; launch scripts show its INFO lines.
log = logging.getLogger(__name__)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       on_validation: ValidationCallback | None = None,
                       final_splits: Sequence[str] | None = None) -> dict[str, Any]:
  """Trains, evaluates the best checkpoint on `final_splits`, samples text.

  Re-running with the same workdir resumes from the latest checkpoint: the
  parameters, optimizer state, recurrent state, RNG, step and data position
  are restored, so the run continues as if it had not stopped. SIGTERM or
  SIGINT during training saves a checkpoint after the current update and
  raises `Preempted` (`StopRequest`). A non-finite loss or gradient is dealt
  with as `train.nonfinite` says (stop, skip or rollback; lm_zoo/configs.py).

  Args:
    config: the fields of lm_zoo/configs.py.
    workdir: where checkpoints, metrics and the summary go.
    on_validation: called after every validation turn (each epoch's end, and
      every `train.eval_every` steps) once the best checkpoint is saved; an
      exception it raises stops the run there (a tuner's pruner), with the
      checkpoints kept.
    final_splits: the splits the best weights are scored on at the end by
      the evaluator of `config.evaluation` (None: its `splits`; a tuning
      trial leaves out test).

  Returns:
    The run summary that is also written to `workdir/summary.json`.

  Raises:
    ConfigError: the config is invalid (`validate_config`), or does not fit
      the checkpoints in `workdir`.
    WorkdirInUse: another process is training in `workdir`.
    TrainingError: a non-finite loss or gradient that the policy does not
      absorb.
    Preempted: stopped by a signal, after saving a checkpoint.
  """
  validate_config(config)  # before reading data or compiling anything
  workdir = check_workdir(workdir)
  final_splits = split_names(config.evaluation.splits if final_splits is None
                             else final_splits)
  with workdir_lock(workdir):
    return _train_and_evaluate(config, workdir, on_validation, final_splits)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                        on_validation: ValidationCallback | None,
                        final_splits: Sequence[str]) -> dict[str, Any]:
  """`train_and_evaluate` once the work directory is locked."""
  started = time.perf_counter()
  corpus = load_data(config)
  validate_config(config, corpus)
  model = build_model(config.model, len(corpus.vocab))
  optimizer = make_optimizer(config.optimizer, config.averaging.trigger)
  mesh = data_mesh(config.parallel.num_devices)
  check_batch(config.data.batch_size, mesh)
  train_step = make_train_step(
      model, optimizer, config.optimizer.loss_reduction == 'sum_over_time',
      config.optimizer.ar, config.optimizer.tar, mesh,
      skip_nonfinite=config.train.nonfinite == 'skip', drop_state=config.train.drop_state)
  batched = BatchedStream(corpus.train, config.data.batch_size)
  checkpoints, metrics = Checkpoints(workdir), None
  try:
    state, progress, resumed = restore_or_init(config, workdir, checkpoints, model, optimizer,
                                               mesh)
    summary = completed_summary(config, workdir, int(state.step), progress) if resumed else None
    if summary is not None:
      return summary
    save_config(config, workdir)
    record_data(corpus, workdir)
    # Keeps what the run had logged at its checkpoint (a new run: nothing).
    metrics = MetricsWriter(workdir, keep=progress.metrics_records if resumed else 0,
                            resume_step=int(state.step) if resumed else None)
    metrics.hyperparameters(config)
    trainer = Trainer(
        config=config, workdir=workdir, corpus=corpus, model=model, mesh=mesh,
        train_step=train_step, eval_step=make_eval_step(model), batched=batched,
        total_steps=planned_steps(config, batched), checkpoints=checkpoints, metrics=metrics,
        on_validation=on_validation, started=started)
    run = start_run(trainer, state, progress)
    train(trainer, run)
    return finish(trainer, run, final_splits)
  finally:  # also when on_validation or a fault stops the run
    checkpoints.close()
    if metrics is not None:
      metrics.close()


def restore_or_init(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                    checkpoints: Checkpoints, model: RecurrentLM,
                    optimizer: optax.GradientTransformation, mesh: Mesh | None
                    ) -> tuple[TrainState, Progress, bool]:
  """The latest checkpoint's state and progress, or a new state (from the
  best weights of `train.init_from`, when set), laid out over `mesh`; and
  whether it resumed. Checkpoints restore straight into that layout: on
  many processes, arrays restored onto each one's devices could not be
  moved onto the others'."""
  state = place_state(create_train_state(model, optimizer, config), mesh)
  if checkpoints.has_latest():
    check_resumable(config, workdir)
    state, meta = checkpoints.restore_latest(state)
    progress = Progress(**meta)
    log.info('Resumed from step %d (epoch %d, position %d) in %s',
             int(state.step), progress.epoch, progress.position, workdir)
    return state, progress, True
  if config.train.init_from:
    params = initial_params(config.train.init_from, state.params)
    state = place_state(state.replace(params=params, opt_state=optimizer.init(params)), mesh)
    log.info('Fine-tuning the best weights of %s', config.train.init_from)
  return state, Progress(), False


def start_run(t: Trainer, state: TrainState, progress: Progress) -> Run:
  """The run, from `state` laid out over the mesh (`restore_or_init`)."""
  if t.mesh is not None:
    log.info('Data parallel over %d devices: %d rows each', t.mesh.size,
             t.config.data.batch_size // t.mesh.size)
  log.info('Model: %s; %s parameters; train %s tokens, vocab %d',
           describe_model(t.config.model, t.model),
           f'{count_params(state):,}', f'{len(t.corpus.train):,}', len(t.corpus.vocab))
  updates = PendingUpdates(t.config.train, t.metrics, t.workdir, t.checkpoints.has_latest)
  return Run(state, progress, updates,
             step=int(state.step), trained_before=progress.train_seconds,
             tokens_before=progress.train_tokens)


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


def train_epoch(t: Trainer, run: Run, stop: StopRequest) -> RollBack | None:
  """Trains on the epoch's windows from `progress.position` to its end (then
  validates) or to a budget or a signal's stop, and checkpoints. Returns the
  rollback a non-finite update asks for."""
  data, progress = t.config.data, run.progress
  # A rollback lowers the rate for the rest of the run.
  lr = (epoch_learning_rate(t.config.schedule, t.config.optimizer.learning_rate,
                            progress.epoch, progress.valid_losses)
        * t.config.train.rollback_lr_factor ** progress.rollbacks)
  if progress.position == 0:
    # Placed as the steps leave them: fresh host zeros would be another input
    # layout, and the train step would compile again at every epoch.
    run.state = place_state(run.state.replace(carries=t.model.initialize_carry(data.batch_size)),
                            t.mesh)
  for window in t.batched.windows(data.bptt, progress.position, data.variable_bptt,
                                  seed=(t.config.seed, progress.epoch)):
    train_window(t, run, window, lr)
    stopping = budget_spent(t.config, run.step, run.seconds_trained())
    fault = after_update(t, run, lr, stopping, stop)
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


def train_window(t: Trainer, run: Run, window: Window, lr: float) -> None:
  """One update on `window`, at the epoch's rate `lr`."""
  data = t.config.data
  sum_over_time = t.config.optimizer.loss_reduction == 'sum_over_time'
  # AWD-LSTM scales a window's learning rate by its length / bptt; a loss
  # summed over time already grows with the length.
  scale = window.length / data.bptt if data.variable_bptt and not sum_over_time else 1.0
  if lr * scale != run.step_lr:  # no host-to-device copy while the rate holds
    run.step_lr = lr * scale
    run.state = run.state.replace(opt_state=set_learning_rate(run.state.opt_state, run.step_lr))
  run.state, step_metrics = t.train_step(
      run.state, *shard_batch(t.mesh, window.inputs, window.targets, window.weights))
  run.progress.position = window.start + window.length
  run.step += 1
  run.updates.add(run.step, step_metrics)
  run.throughput.add(window.inputs.size)
  run.tokens_trained += window.inputs.size


def after_update(t: Trainer, run: Run, lr: float, stopping: bool,
                 stop: StopRequest) -> RollBack | None:
  """What is due after an update, in turn: a log line, a validation turn, a
  checkpoint, the stop a signal asks for. Each reads back the pending updates
  first, so none sees non-finite weights; a rollback ends the turn."""
  cfg, progress = t.config.train, run.progress
  if run.step % cfg.log_every == 0:
    fault = log_training(t, run, lr)
    if fault is not None:
      return fault
  # A turn every eval_every steps, and one for the weights a budget stops at
  # (the epoch end validates anyway); before the checkpoint, so that a
  # resumed run knows its best score.
  if (cfg.eval_every > 0 and progress.position < t.batched.row_length
      and (run.step % cfg.eval_every == 0 or stopping)):
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


def log_training(t: Trainer, run: Run, lr: float) -> RollBack | None:
  """Logs and records the mean loss and gradient norm of the updates since
  the last line."""
  fetched = run.updates.fetch(run.progress)
  if fetched.rollback is not None:
    return fetched.rollback
  loss = float(fetched.losses.mean()) if fetched.losses.size else math.nan
  grad_norm = float(fetched.grad_norms.mean()) if fetched.grad_norms.size else math.nan
  perplexity = math.exp(min(loss, 700.0))
  rate, total = run.throughput.rate(), t.total_steps
  log.info('epoch %d step %d/%d (%.0f%%)  loss %.4f  ppl %.2f  grad norm %.3g  lr %.4g  '
           '%.0f tokens/s  ETA %s', run.progress.epoch, run.step, total,
           100 * run.step / total, loss, perplexity, grad_norm, lr, rate,
           run.throughput.eta(total - run.step))
  t.metrics.write('train', step=run.step, epoch=run.progress.epoch, loss=loss,
                  perplexity=perplexity, grad_norm=grad_norm, learning_rate=lr,
                  tokens_per_second=rate)
  run.throughput.reset()
  return None


def validate(t: Trainer, run: Run, what: str) -> tuple[EvalResult, bool]:
  """One validation turn: scores the weights evaluation uses (averaged ones
  once averaging started), keeps them when they are the best so far, tells
  on_validation, and starts averaging when the patience trigger says so.
  Returns the result and whether the weights scored were averaged."""
  progress = run.progress
  averaged = averaged_params(run.state.opt_state)
  params = run.state.params if averaged is None else averaged
  result = score_split(t, 'valid', params)
  log.info('%s: valid %s%s', what, result.summary(),
           '' if averaged is None else ' (averaged weights)')
  t.metrics.write('valid', step=run.step, epoch=progress.epoch, averaged=averaged is not None,
                  **result.as_dict())
  if result.loss < progress.best_valid:
    progress.best_valid, progress.best_step = result.loss, run.step
    t.checkpoints.save_best(run.step, params, {'epoch': progress.epoch,
                                               'valid_loss': result.loss})
  if t.on_validation is not None:
    t.on_validation(run.step, progress.epoch, result)
  if averaged is None and patience_reached(t.config.averaging, run.step, progress.best_step):
    average_from_now(t, run, f'step {run.step}')
  return result, averaged is not None


def average_from_now(t: Trainer, run: Run, when: str) -> None:
  run.state = run.state.replace(opt_state=start_averaging(run.state.opt_state))
  log.info('%s: averaging the weights from now on (%s trigger)', when,
           t.config.averaging.trigger)


def end_epoch(t: Trainer, run: Run) -> None:
  """Validates, starts averaging when the epoch trigger says so, and moves
  on to the next epoch."""
  progress = run.progress
  result, averaged = validate(t, run, f'epoch {progress.epoch} done')
  if not averaged and should_start_averaging(
      t.config.averaging, result.loss, progress.valid_losses, progress.epoch,
      t.config.train.num_epochs):
    average_from_now(t, run, f'epoch {progress.epoch}')
  progress.valid_losses.append(result.loss)
  progress.epoch += 1
  progress.position = 0


def save(t: Trainer, run: Run) -> RollBack | None:
  """Checkpoints the run, unless reading back its updates asks for a rollback."""
  fault = run.updates.fetch(run.progress).rollback  # never checkpoint non-finite weights
  if fault is not None:
    return fault
  run.progress.train_seconds = run.seconds_trained()
  run.progress.train_tokens = run.all_tokens_trained()
  run.progress.metrics_records = t.metrics.count
  t.checkpoints.save_latest(run.step, run.state, dataclasses.asdict(run.progress))
  # The next log line's rate is of training alone: a save's seconds counted in
  # its interval made a short one's rate fall 6-fold on a GPU (lamb's turns of
  # 200 steps drift against PTB's 207-step epochs).
  run.throughput.reset()
  return None


def preempt(t: Trainer, run: Run, signum: int) -> RollBack:
  """Checkpoints the run and raises `Preempted`; returns the rollback that
  reading back its updates asks for instead."""
  fault = save(t, run)
  if fault is not None:
    return fault
  raise Preempted(
      f'{signal.Signals(signum).name} received: training stopped at step {run.step} '
      f'(epoch {run.progress.epoch}) with a checkpoint in {t.workdir}/checkpoints; run '
      'the same command to resume', signum)


def roll_back(t: Trainer, run: Run, fault: RollBack) -> None:
  """Restores the latest checkpoint, with the learning rate lowered for the
  rest of the run (train.rollback_lr_factor)."""
  cfg = t.config.train
  rollbacks = run.progress.rollbacks + 1
  restored, meta = t.checkpoints.restore_latest(run.state)
  run.state, run.progress = place_state(restored, t.mesh), Progress(**meta)
  run.progress.rollbacks = rollbacks
  run.step, run.step_lr = int(run.state.step), None
  t.metrics.truncate(run.progress.metrics_records)  # the abandoned steps' records go
  scale = cfg.rollback_lr_factor ** rollbacks
  log.warning('step %d: non-finite loss or gradient, rolled back to the checkpoint of '
              'step %d with the learning rate x %g (rollback %d of at most %d)', fault.step,
              run.step, scale, rollbacks, cfg.max_rollbacks)
  t.metrics.write('nonfinite', step=fault.step, epoch=run.progress.epoch, action='rollback',
                  to_step=run.step, learning_rate_scale=scale, rollbacks=rollbacks)
  run.throughput.reset()
