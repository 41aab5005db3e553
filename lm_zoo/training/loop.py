"""`train_and_evaluate(config, workdir)`: training with resumable checkpoints."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import signal
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from lm_zoo import generation
from lm_zoo.data import BatchedStream, Corpus, load_corpus
from lm_zoo.errors import Preempted
from lm_zoo.runtime import environment
from lm_zoo.models import RecurrentLM, build_model, init_params, legacy_transposed
from lm_zoo.training.averaging import (averaged_params, patience_reached, should_start_averaging,
                                      start_averaging)
from lm_zoo.training.checkpoints import Checkpoints, write_text_atomically
from lm_zoo.training.evaluation import EvalResult, evaluate_stream
from lm_zoo.training.metrics import MetricsWriter, Throughput, format_duration
from lm_zoo.training.nonfinite import PendingUpdates, RollBack
from lm_zoo.training.optimizers import epoch_learning_rate, make_optimizer, set_learning_rate
from lm_zoo.training.parallel import check_batch, data_mesh, shard_batch, state_shardings
from lm_zoo.training.preemption import StopRequest
from lm_zoo.training.steps import TrainState, make_eval_step, make_train_step
from lm_zoo.training.workdir import (check_resumable, initial_params, save_config,
                                     workdir_lock)
from lm_zoo.validation import validate_config

# Progress goes to the 'lm_zoo' logger; launch scripts show its INFO lines.
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Progress:
  """Where training stands, saved as JSON beside each checkpoint."""

  epoch: int = 1
  position: int = 0  # time index within the epoch's rows of the next window
  valid_losses: list[float] = dataclasses.field(default_factory=list)
  best_valid: float = math.inf
  best_step: int = 0  # the update after which best_valid was scored
  skipped_updates: int = 0  # dropped for a non-finite loss or gradient (train.nonfinite=skip)
  rollbacks: int = 0  # restores of a checkpoint after one (train.nonfinite=rollback)
  train_seconds: float = 0.0  # spent training up to this checkpoint (train.max_seconds)


def load_data(config: ml_collections.ConfigDict) -> Corpus:
  """The corpus of `config.data`, cut to the `*_tokens` limits when they are > 0."""
  corpus = load_corpus(config.data.name, config.data.data_dir or None)
  limits = {s: config.data.get(f'{s}_tokens', 0) for s in ('train', 'valid', 'test')}
  return dataclasses.replace(corpus, **{
      s: getattr(corpus, s)[:n] for s, n in limits.items() if n > 0})


def create_train_state(model: RecurrentLM, optimizer, config) -> TrainState:
  key = jax.random.key(config.seed)
  params = init_params(model, key, config.model.init_scale)
  return TrainState(
      step=jax.numpy.zeros((), jax.numpy.int32), params=params,
      opt_state=optimizer.init(params),
      carries=model.initialize_carry(config.data.batch_size),
      rng=jax.random.key_data(jax.random.fold_in(key, 1)))


def evaluate_split(model: RecurrentLM, params: Any, corpus: Corpus, split: str,
                   batch_size: int, bptt: int, eval_step=None) -> EvalResult:
  """Perplexity / bits per character of one split, state carried throughout."""
  eval_step = eval_step or make_eval_step(model)
  return evaluate_stream(eval_step, params, model.initialize_carry(batch_size),
                         corpus.split(split), batch_size, bptt, corpus.unit,
                         what=f'{split} evaluation')


def sample_text(model: RecurrentLM, params: Any, corpus: Corpus, num_lines: int,
                num_tokens: int, seed: int, temperature: float) -> list[str]:
  """`num_lines` samples, each started after an end of sentence."""
  prompt = np.full((num_lines, 1), generation.start_id(corpus.vocab), np.int32)
  ids = generation.sample(model, params, prompt, num_tokens, jax.random.key(seed),
                          temperature)
  return [corpus.vocab.decode(row).strip().replace('\n', ' | ') for row in ids]


# on_validation(step, epoch, result): told each validation turn's result.
ValidationCallback = Callable[[int, int, EvalResult], None]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       on_validation: ValidationCallback | None = None,
                       final_splits: Sequence[str] = ('valid', 'test')) -> dict[str, Any]:
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
    final_splits: the splits the best weights are scored on at the end (a
      tuning trial leaves out test).

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
  workdir = pathlib.Path(workdir)
  with workdir_lock(workdir):
    return _train_and_evaluate(config, workdir, on_validation, final_splits)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                        on_validation: ValidationCallback | None,
                        final_splits: Sequence[str]) -> dict[str, Any]:
  """`train_and_evaluate` once the work directory is locked."""
  run_start = time.perf_counter()
  corpus = load_data(config)
  validate_config(config, corpus)
  model = build_model(config.model, len(corpus.vocab))
  optimizer = make_optimizer(config.optimizer, config.averaging.trigger)
  sum_over_time = config.optimizer.loss_reduction == 'sum_over_time'
  mesh = data_mesh(config.parallel.num_devices)
  check_batch(config.data.batch_size, mesh)
  data_cfg, train_cfg = config.data, config.train
  train_step = make_train_step(model, optimizer, sum_over_time, config.optimizer.ar,
                               config.optimizer.tar, mesh,
                               skip_nonfinite=train_cfg.nonfinite == 'skip',
                               drop_state=train_cfg.drop_state)
  eval_step = make_eval_step(model)
  batched = BatchedStream(corpus.train, data_cfg.batch_size)
  checkpoints, metrics = Checkpoints(workdir, legacy_transposed=legacy_transposed), None
  try:
    state = create_train_state(model, optimizer, config)
    progress = Progress()
    resume_step = None
    if checkpoints.has_latest():
      check_resumable(config, workdir)
      state, meta = checkpoints.restore_latest(state)
      progress = Progress(**meta)
      resume_step = int(state.step)
      log.info('Resumed from step %d (epoch %d, position %d) in %s',
               int(state.step), progress.epoch, progress.position, workdir)
    elif train_cfg.init_from:
      params = initial_params(train_cfg.init_from, state.params)
      state = state.replace(params=params, opt_state=optimizer.init(params))
      log.info('Fine-tuning the best weights of %s', train_cfg.init_from)
    save_config(config, workdir)
    # Drops what a stopped run logged past its checkpoint.
    metrics = MetricsWriter(workdir, resume_step=resume_step)
    place = ((lambda state: state) if mesh is None else
             (lambda state: jax.device_put(state, state_shardings(state, mesh))))
    state = place(state)
    if mesh is not None:
      log.info('Data parallel over %d devices: %d rows each', mesh.size,
               data_cfg.batch_size // mesh.size)
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    log.info('Model: %s, %s parameters; train %s tokens, vocab %d', config.model.cell,
             f'{num_params:,}', f'{len(corpus.train):,}', len(corpus.vocab))

    step, throughput = int(state.step), Throughput()
    updates = PendingUpdates(train_cfg, metrics, workdir)
    total_steps = planned_steps(config, batched)
    tokens_trained = 0
    step_lr = None  # the rate in opt_state, once this process has set it

    def roll_back(at: int) -> None:
      """Restores the latest checkpoint after update `at` was not finite."""
      nonlocal state, progress, step, step_lr
      rollbacks = progress.rollbacks + 1
      restored, meta = checkpoints.restore_latest(state)
      state, progress = place(restored), Progress(**meta)
      progress.rollbacks = rollbacks
      step, step_lr = int(state.step), None
      scale = train_cfg.rollback_lr_factor ** rollbacks
      log.warning('step %d: non-finite loss or gradient, rolled back to the checkpoint of '
                  'step %d with the learning rate x %g (rollback %d of at most %d)', at,
                  step, scale, rollbacks, train_cfg.max_rollbacks)
      metrics.write('nonfinite', step=at, epoch=progress.epoch, action='rollback',
                    to_step=step, learning_rate_scale=scale, rollbacks=rollbacks)

    def save() -> None:
      updates.fetch(progress)  # never checkpoint non-finite weights
      progress.train_seconds = trained_before + time.perf_counter() - train_start
      checkpoints.save_latest(step, state, dataclasses.asdict(progress))

    def preempt(signum: int) -> None:
      save()
      raise Preempted(
          f'{signal.Signals(signum).name} received: training stopped at step {step} '
          f'(epoch {progress.epoch}) with a checkpoint in {workdir}/checkpoints; run '
          'the same command to resume', signum)

    def validate(what: str) -> tuple[EvalResult, bool]:
      """One validation turn: scores the weights evaluation uses (averaged
      ones once averaging started), keeps them when they are the best so far,
      tells on_validation, and starts averaging when the patience trigger
      says so. Returns the result and whether the weights scored were averaged."""
      nonlocal state
      averaged = averaged_params(state.opt_state)
      params = state.params if averaged is None else averaged
      result = evaluate_split(model, params, corpus, 'valid', data_cfg.eval_batch_size,
                              data_cfg.bptt, eval_step)
      log.info('%s: valid %s%s', what, result.summary(),
               '' if averaged is None else ' (averaged weights)')
      metrics.write('valid', step=step, epoch=progress.epoch, averaged=averaged is not None,
                    **result.as_dict())
      if result.loss < progress.best_valid:
        progress.best_valid, progress.best_step = result.loss, step
        checkpoints.save_best(step, params, {'epoch': progress.epoch,
                                             'valid_loss': result.loss})
      if on_validation is not None:
        on_validation(step, progress.epoch, result)
      if averaged is None and patience_reached(config.averaging, step, progress.best_step):
        average_from_now(f'step {step}')
      return result, averaged is not None

    def average_from_now(when: str) -> None:
      nonlocal state
      state = state.replace(opt_state=start_averaging(state.opt_state))
      log.info('%s: averaging the weights from now on (%s trigger)', when,
               config.averaging.trigger)

    def end_epoch() -> None:
      result, averaged = validate(f'epoch {progress.epoch} done')
      if not averaged and should_start_averaging(
          config.averaging, result.loss, progress.valid_losses, progress.epoch,
          train_cfg.num_epochs):
        average_from_now(f'epoch {progress.epoch}')
      progress.valid_losses.append(result.loss)
      progress.epoch += 1
      progress.position = 0

    max_steps = train_cfg.max_steps if train_cfg.max_steps > 0 else math.inf
    train_start = time.perf_counter()
    trained_before = progress.train_seconds  # by the runs this one resumes
    out_of_time = lambda: (train_cfg.max_seconds > 0
                           and trained_before + time.perf_counter() - train_start
                           >= train_cfg.max_seconds)
    if train_cfg.nonfinite == 'rollback' and not checkpoints.has_latest():
      save()  # a finite state to roll back to before the first checkpoint
    with StopRequest() as stop:
      while progress.epoch <= train_cfg.num_epochs and step < max_steps and not out_of_time():
        # A rollback lowers the rate for the rest of the run.
        lr = (epoch_learning_rate(config.schedule, config.optimizer.learning_rate,
                                  progress.epoch, progress.valid_losses)
              * train_cfg.rollback_lr_factor ** progress.rollbacks)
        if progress.position == 0:
          state = state.replace(carries=model.initialize_carry(data_cfg.batch_size))
        windows = batched.windows(data_cfg.bptt, progress.position, data_cfg.variable_bptt,
                                  seed=(config.seed, progress.epoch))
        try:
          for window in windows:
            # AWD-LSTM scales a window's learning rate by its length / bptt; a loss
            # summed over time already grows with the length.
            scale = (window.length / data_cfg.bptt
                     if data_cfg.variable_bptt and not sum_over_time else 1.0)
            if lr * scale != step_lr:  # no host-to-device copy while the rate holds
              step_lr = lr * scale
              state = state.replace(opt_state=set_learning_rate(state.opt_state, step_lr))
            state, step_metrics = train_step(
                state, *shard_batch(mesh, window.inputs, window.targets, window.weights))
            progress.position = window.start + window.length
            step += 1
            updates.add(step, step_metrics)
            throughput.tokens += window.inputs.size
            throughput.steps += 1
            tokens_trained += window.inputs.size
            if step % train_cfg.log_every == 0:
              losses = updates.fetch(progress)
              loss = float(losses.mean()) if losses.size else math.nan
              rate = throughput.rate()
              log.info('epoch %d step %d/%d (%.0f%%)  loss %.4f  ppl %.2f  lr %.4g  '
                       '%.0f tokens/s  ETA %s', progress.epoch, step, total_steps,
                       100 * step / total_steps, loss, math.exp(min(loss, 700.0)), lr, rate,
                       throughput.eta(total_steps - step))
              metrics.write('train', step=step, epoch=progress.epoch, loss=loss,
                            learning_rate=lr, tokens_per_second=rate)
              throughput.reset()
            stopping = step >= max_steps or out_of_time()
            # A turn every eval_every steps, and one for the weights a budget
            # stops at (the epoch end validates anyway); before the checkpoint,
            # so that a resumed run knows its best score.
            if (train_cfg.eval_every > 0 and progress.position < batched.row_length
                and (step % train_cfg.eval_every == 0 or stopping)):
              updates.fetch(progress)  # validate finite weights only
              validate(f'epoch {progress.epoch} step {step}')
              throughput.reset()
            if train_cfg.checkpoint_every > 0 and step % train_cfg.checkpoint_every == 0:
              save()
            if stop.signum is not None:
              preempt(stop.signum)
            if stopping:
              break
          if progress.position >= batched.row_length:
            updates.fetch(progress)  # validate finite weights only
            end_epoch()
            throughput.reset()
          save()
        except RollBack as fault:
          roll_back(fault.step)
          throughput.reset()
    train_seconds = time.perf_counter() - train_start

    best = checkpoints.restore_best(state.params)
    if best is None:  # stopped before the first epoch ended: use the last params
      params, best_meta = state.params, {'epoch': progress.epoch}
    else:
      params, best_meta = best
    summary: dict[str, Any] = {
        'step': step, 'best_epoch': best_meta['epoch'],
        # the whole run's, over the processes it was resumed by; the rate is this one's
        'train_seconds': round(trained_before + train_seconds, 1),
        'tokens_per_second': round(tokens_trained / max(train_seconds, 1e-9), 1),
        'num_params': int(num_params), 'unit': corpus.unit,
        'skipped_updates': progress.skipped_updates, 'rollbacks': progress.rollbacks,
        'environment': environment()}
    batch_sizes = {'valid': data_cfg.eval_batch_size, 'test': data_cfg.test_batch_size}
    for split in final_splits:
      batch_size = batch_sizes[split]
      result = evaluate_split(model, params, corpus, split, batch_size, data_cfg.bptt,
                              eval_step)  # compiled already for the validation shapes
      log.info('%s %s (%d tokens, batch %d)', split, result.summary(),
                   result.num_tokens, batch_size)
      metrics.write(split, step=step, final=True, **result.as_dict())
      summary[split] = result.as_dict()
    gen = config.generate
    if gen.num_lines > 0:
      summary['samples'] = sample_text(model, params, corpus, gen.num_lines,
                                       gen.num_tokens, config.seed, gen.temperature)
      for line in summary['samples']:
        log.info('sample: %s', line)
    summary['wall_seconds'] = round(time.perf_counter() - run_start, 1)
    write_text_atomically(workdir / 'summary.json', json.dumps(summary, indent=2))
    log.info('%s', run_summary(summary, workdir))
    return summary
  finally:  # also when on_validation or a fault stops the run
    checkpoints.close()
    if metrics is not None:
      metrics.close()


def planned_steps(config: ml_collections.ConfigDict, batched: BatchedStream) -> int:
  """Updates in the whole run: every epoch's windows, at most train.max_steps."""
  data_cfg = config.data
  total = sum(batched.num_windows(data_cfg.bptt, data_cfg.variable_bptt,
                                  seed=(config.seed, epoch))
              for epoch in range(1, config.train.num_epochs + 1))
  return min(total, config.train.max_steps) if config.train.max_steps > 0 else total


def run_summary(summary: dict[str, Any], workdir: pathlib.Path) -> str:
  """The lines printed when a run ends: its scores, time and speed."""
  scores = '  '.join(f"{split} {EvalResult(summary[split]['loss'], 0, summary['unit']).summary()}"
                     for split in ('valid', 'test') if split in summary)
  return (f'Run summary ({workdir}): {summary["step"]} steps, best epoch '
          f'{summary["best_epoch"]}\n  {scores}\n  wall time '
          f'{format_duration(summary["wall_seconds"])} (training '
          f'{format_duration(summary["train_seconds"])}, '
          f'{summary["tokens_per_second"]:,.0f} tokens/s)')
