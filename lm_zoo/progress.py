"""Progress lines with an ETA for long loops, and durations as text."""

from __future__ import annotations

import logging
import math
import time

import jax

log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
  """A duration as '1h02m', '4m05s' or '12s'."""
  if not math.isfinite(seconds):
    return '?'
  seconds = round(seconds)
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f'{hours}h{minutes:02d}m'
  return f'{minutes}m{seconds:02d}s' if minutes else f'{seconds}s'


def eta(seconds_so_far: float, done: float, total: float) -> str:
  """The time left at the rate so far, formatted."""
  if done <= 0:
    return '?'
  return format_duration(seconds_so_far / done * max(total - done, 0))


class ProgressLog:
  """Logs `WHAT: done/total (pct), ETA` at most every `interval` seconds.

  For loops that dispatch jitted work asynchronously: `update(done, latest)`
  waits for `latest` (an array the loop produced) only when a line is due,
  so the count it reports is work finished, not merely queued.
  """

  def __init__(self, what: str, total: int, unit: str = 'windows',
               interval: float = 30.0):
    self.what, self.total, self.unit, self.interval = what, total, unit, interval
    self.start = self.last = time.perf_counter()

  def update(self, done: int, latest=None) -> None:
    if time.perf_counter() - self.last < self.interval or done >= self.total:
      return
    if latest is not None:
      jax.block_until_ready(latest)
    self.last = time.perf_counter()
    log.info('%s: %d/%d %s (%.0f%%), ETA %s', self.what, done, self.total, self.unit,
             100 * done / self.total, eta(self.last - self.start, done, self.total))


class Throughput:
  """Tokens and steps per second between log lines."""

  def __init__(self):
    self.reset()

  def reset(self):
    self.start, self.tokens, self.steps = time.perf_counter(), 0, 0

  def rate(self) -> float:
    return self.tokens / max(time.perf_counter() - self.start, 1e-9)

  def eta(self, steps_left: int) -> str:
    """The time `steps_left` take at this interval's rate (the first
    interval includes compilation, so its ETA is high)."""
    return eta(time.perf_counter() - self.start, self.steps, self.steps + steps_left)
