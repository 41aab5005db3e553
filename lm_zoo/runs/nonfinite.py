"""What training does with an update whose loss or gradient is not finite:
`train.nonfinite` stops, skips it, or rolls back (lm_zoo/configs.py)."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, Callable, NamedTuple, Sequence

import jax
import ml_collections
import numpy as np

from lm_zoo.errors import TrainingError
from lm_zoo.runs.metrics import MetricsWriter

NONFINITE_POLICIES = ('stop', 'skip', 'rollback')  # train.nonfinite
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RollBack:
  """Under the rollback policy update `step` was not finite for the seeds at
  `seeds` (their indices on the seed axis): the loop restores its latest
  checkpoint, lowers their rates, and goes on from that checkpoint's
  position."""

  step: int
  seeds: tuple[int, ...] = (0,)


class Fetched(NamedTuple):
  """What `PendingUpdates.fetch` read back: an update a row, a seed a column."""

  losses: np.ndarray  # the losses, nan where an update was not finite
  grad_norms: np.ndarray  # their gradient norms (before clipping), nan likewise
  rollback: RollBack | None  # asked for by a non-finite update (train.nonfinite=rollback)


class PendingUpdates:
  """The updates a loop has dispatched and not yet read back, each with a
  loss, a gradient norm and a `finite` flag per seed.

  The loop does not wait for each step's loss: it keeps the device arrays and
  `fetch`es them every few steps (and before it validates or checkpoints, so
  that neither sees non-finite weights). A non-finite one is dealt with there,
  seed by seed: 'stop' raises TrainingError; 'skip' counts it (the step
  itself dropped that seed's update) and raises TrainingError after
  `max_consecutive_skips` in a row; 'rollback' returns a `RollBack`, or
  raises TrainingError after `max_rollbacks` of that seed. Each is also
  recorded as a 'nonfinite' metrics record (with the seed's `seed_fields`).
  """

  def __init__(
    self,
    train_cfg: ml_collections.ConfigDict,
    metrics: MetricsWriter,
    workdir: pathlib.Path,
    has_checkpoint: Callable[[], bool] = lambda: True,
    seeds: Sequence[int] | None = None,
  ):
    """`has_checkpoint()`: whether the run has a checkpoint to resume from
    (what the 'stop' policy's message advises); `seeds`: the seeds on the
    seed axis, named in messages and records (None: one seed, unnamed)."""
    self._cfg, self._metrics, self._workdir = train_cfg, metrics, workdir
    self._has_checkpoint = has_checkpoint
    self._seeds = seeds
    # (step, losses, gradient norms, finite) on the device, an entry per seed
    self._pending: list[tuple[int, Any, Any, Any]] = []
    self._skips_in_a_row = np.zeros(1 if seeds is None else len(seeds), np.int64)

  def add(self, step: int, step_metrics: dict[str, Any]) -> None:
    self._pending.append(
      (step, step_metrics['loss'], step_metrics['grad_norm'], step_metrics['finite'])
    )

  def _named(self, k: int) -> tuple[str, dict[str, int]]:
    """Seed `k`'s prefix in messages and its fields in records."""
    if self._seeds is None:
      return '', {}
    return f'seed {self._seeds[k]}: ', {'seed': self._seeds[k]}

  def fetch(self, progress) -> Fetched:
    """The losses of the updates added since the last fetch, once the policy
    has dealt with the non-finite ones; under 'rollback', up to the first
    update that is not finite, with the `RollBack` it asks for. `progress`
    (the loop's `Progress`) counts the skipped updates."""
    fetched = jax.device_get(self._pending)
    self._pending.clear()
    width = len(self._skips_in_a_row)
    losses, norms = [], []
    for at, loss, norm, finite in fetched:
      finite = np.broadcast_to(np.asarray(finite, bool), (width,))
      faulty = tuple(int(k) for k in np.flatnonzero(~finite))
      if faulty and self._cfg.nonfinite == 'rollback':
        for k in faulty:
          self._check_rollbacks_left(at, k, progress)
        return self._fetched(losses, norms, width, RollBack(at, faulty))
      if faulty and self._cfg.nonfinite != 'skip':
        self._stop(at, faulty[0], progress)
      for k in faulty:
        self._skip(at, k, progress)
      self._skips_in_a_row[finite] = 0
      losses.append(np.where(finite, np.broadcast_to(loss, (width,)), np.nan))
      norms.append(np.where(finite, np.broadcast_to(norm, (width,)), np.nan))
    return self._fetched(losses, norms, width, None)

  @staticmethod
  def _fetched(losses, norms, width: int, rollback: RollBack | None) -> Fetched:
    shape = (len(losses), width)
    return Fetched(
      np.array(losses, np.float64).reshape(shape),
      np.array(norms, np.float64).reshape(shape),
      rollback,
    )

  def _stop(self, at: int, k: int, progress) -> None:
    named, fields = self._named(k)
    self._metrics.write('nonfinite', step=at, epoch=progress.epoch, **fields, action='stop')
    resume = (
      f'The latest checkpoint in {self._workdir}/checkpoints holds finite '
      'weights: lower the learning rate or clip gradients harder, then run '
      'the same command again to resume from it'
      if self._has_checkpoint()
      else 'No checkpoint was written before it: lower the learning rate or clip '
      'gradients harder, then run the same command again to start afresh'
    )
    raise TrainingError(
      f'{named}the training loss or gradient is not finite at or before step {at} '
      f'(epoch {progress.epoch}). {resume} (or set '
      '--config.train.nonfinite=skip or rollback).'
    )

  def _skip(self, at: int, k: int, progress) -> None:
    named, fields = self._named(k)
    progress.skipped_updates[k] += 1
    self._skips_in_a_row[k] += 1
    log.warning(
      '%sstep %d: non-finite loss or gradient, update skipped (%d skipped so far)',
      named,
      at,
      progress.skipped_updates[k],
    )
    self._metrics.write(
      'nonfinite',
      step=at,
      epoch=progress.epoch,
      **fields,
      action='skip',
      skipped_updates=progress.skipped_updates[k],
    )
    if self._skips_in_a_row[k] > self._cfg.max_consecutive_skips:
      raise TrainingError(
        f'{named}{self._skips_in_a_row[k]} updates in a row up to step {at} had a '
        f'non-finite loss or gradient (more than train.max_consecutive_skips='
        f'{self._cfg.max_consecutive_skips}): the weights have diverged. Lower the '
        'learning rate or clip gradients harder, and train again in a new --workdir.'
      )

  def _check_rollbacks_left(self, at: int, k: int, progress) -> None:
    named, fields = self._named(k)
    rollbacks = progress.rollbacks[k]
    if rollbacks >= self._cfg.max_rollbacks:
      self._metrics.write(
        'nonfinite', step=at, epoch=progress.epoch, **fields, action='stop', rollbacks=rollbacks
      )
      raise TrainingError(
        f'{named}the training loss or gradient is not finite at step {at} after '
        f'{rollbacks} rollbacks (train.max_rollbacks={self._cfg.max_rollbacks}): lower '
        'optimizer.learning_rate or clip gradients harder (optimizer.clip_norm), then '
        'train again.'
      )
