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

  def __init__(self, what: str, total: int, unit: str = 'windows', interval: float = 30.0):
    self.what, self.total, self.unit, self.interval = what, total, unit, interval
    self.start = self.last = time.perf_counter()

  def update(self, done: int, latest=None) -> None:
    if time.perf_counter() - self.last < self.interval or done >= self.total:
      return
    if latest is not None:
      jax.block_until_ready(latest)
    self.last = time.perf_counter()
    log.info(
      '%s: %d/%d %s (%.0f%%), ETA %s',
      self.what,
      done,
      self.total,
      self.unit,
      100 * done / self.total,
      eta(self.last - self.start, done, self.total),
    )


class Throughput:
  """Tokens per second between log lines, and the time left at the pace kept
  since the first line.

  The rate of a line is its interval's training alone (`reset` after a
  validation turn and after a checkpoint's save leaves them out). The ETA is
  the pace from the first line on, validation and checkpoints included, so it
  neither counts the first interval's compilation nor jumps with each
  interval's noise.
  """

  def __init__(self):
    self.updates = 0  # by this process
    self.paced_from: tuple[float, int] | None = None  # (time, updates) at the first line
    self.reset()

  def reset(self):
    self.start, self.tokens, self.steps = time.perf_counter(), 0, 0

  def add(self, tokens: int) -> None:
    """Counts one update of `tokens` tokens."""
    self.tokens += tokens
    self.steps += 1
    self.updates += 1

  def rate(self) -> float:
    return self.tokens / max(time.perf_counter() - self.start, 1e-9)

  def eta(self, steps_left: int) -> str:
    """The time `steps_left` updates take at the pace since the first line;
    at the first line, at its interval's rate (with compilation: high)."""
    now = time.perf_counter()
    if self.paced_from is None:
      self.paced_from = (now, self.updates)
      return eta(now - self.start, self.steps, self.steps + steps_left)
    since, updates_then = self.paced_from
    done = self.updates - updates_then
    return eta(now - since, done, done + steps_left)
