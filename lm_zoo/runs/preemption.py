"""Stopping training cleanly on SIGTERM or SIGINT (a preempted job, Ctrl-C)."""

from __future__ import annotations

import logging
import os
import signal
import threading

import jax
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
  """While entered, turns SIGTERM and SIGINT into a request that the training
  loop reads after each update (`requested`), so that it can checkpoint and
  stop between steps rather than die inside one.

  The first signal only sets `signum`; the handlers in place before are then
  restored, so a second signal acts as it would have without us (Ctrl-C twice
  stops at once). Signal handlers belong to the main thread: elsewhere (a
  training run in a worker thread) this does nothing.

  In a multi-process run the processes must stop at the same step, each
  saving its part of one checkpoint: SIGTERM is left to the preemption
  notifier of `jax.distributed.initialize`, which tells the other processes
  through the coordinator, and SIGINT is passed on to it as a SIGTERM to this
  process (the notifier listens for SIGTERM only); `requested` is then JAX's
  preemption sync point, true on every process at the same step. A second
  SIGINT stops this process at once, as in one process.
  """

  def __init__(self):
    self.signum: int | None = None
    self._previous: dict[int, object] = {}
    self._synced = False

  def __enter__(self) -> StopRequest:
    self._synced = jax.process_count() > 1
    if threading.current_thread() is threading.main_thread():
      if self._synced:
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._pass_on)
      else:
        for signum in SIGNALS:
          self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def requested(self, step: int) -> int | None:
    """The signal that asks to stop after update `step`, or None. On many
    processes it must be asked after every update, the same steps on each."""
    if self._synced:
      return signal.SIGTERM if multihost_utils.reached_preemption_sync_point(step) else None
    return self.signum

  def __exit__(self, *exc_info) -> None:
    self._restore()

  def _handle(self, signum: int, frame) -> None:
    self.signum = signum
    self._restore()
    log.warning(
      '%s received: saving a checkpoint after this update, then stopping '
      '(send it again to stop at once)',
      signal.Signals(signum).name,
    )

  def _pass_on(self, signum: int, frame) -> None:
    self._restore()
    log.warning(
      'SIGINT received: passed on as SIGTERM, so that every process saves a '
      'checkpoint after the same update and stops (send SIGINT again to stop '
      'this process at once)'
    )
    os.kill(os.getpid(), signal.SIGTERM)

  def _restore(self) -> None:
    for signum, handler in self._previous.items():
      # None: a handler not installed from Python; the default is the closest.
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    self._previous.clear()
