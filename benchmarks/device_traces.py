"""What a profile says a benchmark row's device ran: the kernels in a
`jax.profiler` trace (Perfetto's JSON), how long they kept the device busy,
and those that took longest."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os


def top_kernels(traced: dict, per: float, unit: str, top: int) -> list[dict]:
  """The `top` kernels of `device_kernels`' `by_name` that took longest in
  all: each one's count and microseconds per `unit` (`per` of them traced),
  and its microseconds a launch."""
  return [
    {
      'name': kernel,
      f'per_{unit}': count / per,
      f'us_per_{unit}': seconds / per * 1e6,
      'us_each': seconds / count * 1e6,
    }
    for kernel, (count, seconds) in list(traced['by_name'].items())[:top]
  ]


def device_kernels(trace_dir: str) -> dict | None:
  """The GPU work in the Perfetto trace under `trace_dir`: how many events
  ran on the device's streams (kernels, and the few copies and memsets
  there), and the wall time they kept it busy (the union of their
  intervals, so that overlapping streams count once) over the span from the
  first one's start to the last one's end; and per kernel name, how many
  ran and their summed seconds (`by_name`, the longest first). None when the
  trace holds no device streams (a CPU run)."""
  paths = glob.glob(os.path.join(trace_dir, '**', 'perfetto_trace.json.gz'), recursive=True)
  if not paths:
    return None
  with gzip.open(max(paths, key=os.path.getmtime), 'rt') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  names = {}  # (pid, tid) -> thread name, pid -> process name
  for e in events:
    if e.get('ph') == 'M' and e.get('name') == 'process_name':
      names[e['pid']] = e['args']['name']
    elif e.get('ph') == 'M' and e.get('name') == 'thread_name':
      names[e['pid'], e['tid']] = e['args']['name']
  on_device = [
    e
    for e in events
    if e.get('ph') == 'X'
    and names.get(e['pid'], '').startswith('/device:')
    and names.get((e['pid'], e['tid']), '').startswith('Stream')
  ]
  if not on_device:
    return None
  kernels = sorted((e['ts'], e['ts'] + e.get('dur', 0.0)) for e in on_device)
  by_name = collections.defaultdict(lambda: [0, 0.0])
  for e in on_device:
    by_name[e['name']][0] += 1
    by_name[e['name']][1] += e.get('dur', 0.0) * 1e-6
  busy, end = 0.0, -float('inf')
  for start, stop in kernels:  # union of the intervals, in microseconds
    busy += max(0.0, stop - max(start, end))
    end = max(end, stop)
  span = end - kernels[0][0]
  return {
    'kernels': len(kernels),
    'busy_seconds': busy * 1e-6,
    'span_seconds': span * 1e-6,
    'by_name': dict(sorted(by_name.items(), key=lambda item: -item[1][1])),
  }
