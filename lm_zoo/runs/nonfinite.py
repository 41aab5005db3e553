"""What training does with an update whose loss or gradient is not finite:
`train.nonfinite` stops, skips it, or rolls back (lm_zoo/configs.py)."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, Callable, NamedTuple

import jax
import ml_collections
import numpy as np

from lm_zoo.errors import TrainingError
from lm_zoo.runs.metrics import MetricsWriter

NONFINITE_POLICIES = ('stop', 'skip', 'rollback')  # train.nonfinite
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RollBack:
  """Under the rollback policy update `step` was not finite: the loop restores
  its latest checkpoint and goes on from that checkpoint's position."""

  step: int


class Fetched(NamedTuple):
  """What `PendingUpdates.fetch` read back."""

  losses: np.ndarray  # the finite losses, in order
  grad_norms: np.ndarray  # their updates' gradient norms (before clipping)
  rollback: RollBack | None  # asked for by a non-finite update (train.nonfinite=rollback)


class PendingUpdates:
  """The updates a loop has dispatched and not yet read back.

  The loop does not wait for each step's loss: it keeps the device arrays and
  `fetch`es them every few steps (and before it validates or checkpoints, so
  that neither sees non-finite weights). A non-finite one is dealt with there:
  'stop' raises TrainingError; 'skip' counts it (the step itself dropped the
  update) and raises TrainingError after `max_consecutive_skips` in a row;
  'rollback' returns a `RollBack`, or raises TrainingError after `max_rollbacks`.
  Each is also recorded as a 'nonfinite' metrics record.
  """

  def __init__(self, train_cfg: ml_collections.ConfigDict, metrics: MetricsWriter,
               workdir: pathlib.Path, has_checkpoint: Callable[[], bool] = lambda: True):
    """`has_checkpoint()`: whether the run has a checkpoint to resume from
    (what the 'stop' policy's message advises)."""
    self._cfg, self._metrics, self._workdir = train_cfg, metrics, workdir
    self._has_checkpoint = has_checkpoint
    # (step, loss, gradient norm, finite) on the device
    self._pending: list[tuple[int, Any, Any, Any]] = []
    self._skips_in_a_row = 0

  def add(self, step: int, step_metrics: dict[str, Any]) -> None:
    self._pending.append((step, step_metrics['loss'], step_metrics['grad_norm'],
                          step_metrics['finite']))

  def fetch(self, progress) -> Fetched:
    """The finite losses of the updates added since the last fetch, once the
    policy has dealt with the others; under 'rollback', up to the first that
    is not finite, with the `RollBack` it asks for. `progress` (the loop's
    `Progress`) counts the skipped updates and rollbacks."""
    fetched = jax.device_get(self._pending)
    self._pending.clear()
    losses, norms = [], []
    for at, loss, norm, finite in fetched:
      if finite:
        self._skips_in_a_row = 0
        losses.append(loss)
        norms.append(norm)
      elif self._cfg.nonfinite == 'skip':
        self._skip(at, progress)
      elif self._cfg.nonfinite == 'rollback':
        self._check_rollbacks_left(at, progress)
        return Fetched(np.array(losses, np.float64), np.array(norms, np.float64), RollBack(at))
      else:
        self._metrics.write('nonfinite', step=at, epoch=progress.epoch, action='stop')
        resume = (f'The latest checkpoint in {self._workdir}/checkpoints holds finite '
                  'weights: lower the learning rate or clip gradients harder, then run '
                  'the same command again to resume from it'
                  if self._has_checkpoint() else
                  'No checkpoint was written before it: lower the learning rate or clip '
                  'gradients harder, then run the same command again to start afresh')
        raise TrainingError(
            f'the training loss or gradient is not finite at or before step {at} '
            f'(epoch {progress.epoch}). {resume} (or set '
            '--config.train.nonfinite=skip or rollback).')
    return Fetched(np.array(losses, np.float64), np.array(norms, np.float64), None)

  def _skip(self, at: int, progress) -> None:
    progress.skipped_updates += 1
    self._skips_in_a_row += 1
    log.warning('step %d: non-finite loss or gradient, update skipped (%d skipped so far)',
                at, progress.skipped_updates)
    self._metrics.write('nonfinite', step=at, epoch=progress.epoch, action='skip',
                        skipped_updates=progress.skipped_updates)
    if self._skips_in_a_row > self._cfg.max_consecutive_skips:
      raise TrainingError(
          f'{self._skips_in_a_row} updates in a row up to step {at} had a non-finite loss '
          f'or gradient (more than train.max_consecutive_skips='
          f'{self._cfg.max_consecutive_skips}): the weights have diverged. Lower the '
          'learning rate or clip gradients harder, and train again in a new --workdir.')

  def _check_rollbacks_left(self, at: int, progress) -> None:
    if progress.rollbacks >= self._cfg.max_rollbacks:
      self._metrics.write('nonfinite', step=at, epoch=progress.epoch, action='stop',
                          rollbacks=progress.rollbacks)
      raise TrainingError(
          f'the training loss or gradient is not finite at step {at} after '
          f'{progress.rollbacks} rollbacks (train.max_rollbacks='
          f'{self._cfg.max_rollbacks}): lower optimizer.learning_rate or clip '
          'gradients harder (optimizer.clip_norm), then train again.')
