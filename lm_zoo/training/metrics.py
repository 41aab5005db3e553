"""Metrics as JSON lines in the work directory."""

from __future__ import annotations

import json
import pathlib
import time


class MetricsWriter:
  """Appends one JSON object per line to `workdir/metrics.jsonl`."""

  def __init__(self, workdir: str | pathlib.Path, filename: str = 'metrics.jsonl'):
    self.path = pathlib.Path(workdir) / filename

  def write(self, kind: str, **values) -> None:
    record = {'kind': kind, 'time': round(time.time(), 3), **values}
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')


def read_metrics(path: str | pathlib.Path) -> list[dict]:
  """All records of a metrics file."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
