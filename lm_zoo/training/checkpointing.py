"""The loop's turns that write or read back the run's checkpoint
(lm_zoo/training/loop.py): a save, a signal's save and stop (`preempt`), and
a rollback of every seed to the latest checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import signal

from lm_zoo.errors import Preempted
from lm_zoo.runs.nonfinite import RollBack
from lm_zoo.training.run import Progress, Run, Trainer
from lm_zoo.training.state import restore_state, save_state

log = logging.getLogger(__name__)


def save(t: Trainer, run: Run) -> RollBack | None:
  """Checkpoints the run, unless reading back its updates asks for a rollback."""
  fault = run.updates.fetch(run.progress).rollback  # never checkpoint non-finite weights
  if fault is not None:
    return fault
  run.progress.train_seconds = run.seconds_trained()
  run.progress.train_tokens = run.all_tokens_trained()
  run.progress.metrics_records = t.metrics.count
  save_state(t.checkpoints, run.step, run.state, dataclasses.asdict(run.progress))
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
    'the same command to resume',
    signum,
  )


def roll_back(t: Trainer, run: Run, fault: RollBack) -> None:
  """Restores every seed from the latest checkpoint, with the learning rate
  of the seeds whose update was not finite lowered for the rest of the run
  (train.rollback_lr_factor)."""
  cfg = t.config.train
  rollbacks = list(run.progress.rollbacks)
  for k in fault.seeds:
    rollbacks[k] += 1
  run.state, meta = restore_state(t.checkpoints, run.state, t.mesh)
  run.progress = Progress(**meta)
  run.progress.rollbacks = rollbacks
  run.step, run.step_lr = int(run.state.step[0]), None
  t.metrics.truncate(run.progress.metrics_records)  # the abandoned steps' records go
  for k in fault.seeds:
    scale = cfg.rollback_lr_factor ** rollbacks[k]
    named = f'seed {t.configs[k].seed}: ' if t.num_seeds > 1 else ''
    log.warning(
      '%sstep %d: non-finite loss or gradient, rolled back to the checkpoint of '
      'step %d with the learning rate x %g (rollback %d of at most %d)',
      named,
      fault.step,
      run.step,
      scale,
      rollbacks[k],
      cfg.max_rollbacks,
    )
    t.metrics.write(
      'nonfinite',
      step=fault.step,
      epoch=run.progress.epoch,
      **t.seed_fields(k),
      action='rollback',
      to_step=run.step,
      learning_rate_scale=scale,
      rollbacks=rollbacks[k],
    )
  run.throughput.reset()
