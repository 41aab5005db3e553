"""Metrics as JSON lines in the work directory."""

from __future__ import annotations

import json
import pathlib
import time

METRICS_FILE = 'metrics.jsonl'


class MetricsWriter:
  """Appends one JSON object per line to `workdir/metrics.jsonl`."""

  def __init__(self, workdir: str | pathlib.Path, filename: str = METRICS_FILE):
    self.path = pathlib.Path(workdir) / filename

  def write(self, kind: str, **values) -> None:
    record = {'kind': kind, 'time': round(time.time(), 3), **values}
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')

  def drop_after(self, step: int) -> None:
    """Removes records past `step` and final evaluations (for a resumed run)."""
    if not self.path.exists():
      return
    keep = [r for r in read_metrics(self.path)
            if r.get('step', 0) <= step and not r.get('final')]
    tmp = self.path.with_suffix('.tmp')
    tmp.write_text(''.join(json.dumps(r) + '\n' for r in keep))
    tmp.replace(self.path)  # atomic: a kill now leaves the old or the new file


def read_metrics(path: str | pathlib.Path) -> list[dict]:
  """All records of a metrics file."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
