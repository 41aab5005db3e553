"""How the benchmarks time a call: the best of several, the median of
several after a warm-up, or the mean over a row of calls; each waits for the
work it timed."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import jax


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
  """The best time of `repeats` calls of `fn` (compiled and warmed up first),
  each waited for."""
  jax.block_until_ready(fn())
  best = math.inf
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def median_call(fn: Callable, args, runs: int, warmup: int) -> tuple[Any, dict]:
  """fn(*args)'s result, and {'median_ms': the median of `runs` calls after
  `warmup` untimed ones, 'first_call_s': the first (compiling) call}, each
  call waited for."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return out, {'median_ms': 1e3 * statistics.median(times), 'first_call_s': first}


def seconds_per_call(calls: dict, key: str, steps: int) -> float:
  """Seconds per call of `calls[key]`, over `steps` calls."""
  start = time.perf_counter()
  for _ in range(steps):
    out = calls[key]()
  calls['sync'](out)
  return (time.perf_counter() - start) / steps
