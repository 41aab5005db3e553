"""Metrics as JSON lines and TensorBoard scalars in the work directory."""

from __future__ import annotations

import json
import math
import pathlib
import time
from numbers import Real

from lm_zoo.training.checkpoints import write_text_atomically

METRICS_FILE = 'metrics.jsonl'
TENSORBOARD_DIR = 'tensorboard'
# Record fields that index a scalar rather than being one.
_INDEX_FIELDS = ('step', 'epoch', 'time')


class MetricsWriter:
  """Appends one JSON object per line to `workdir/metrics.jsonl` and writes
  its numbers as TensorBoard scalars under `workdir/tensorboard`.

  A record `write('valid', step=9, perplexity=80.1)` becomes the scalar
  `valid/perplexity` at step 9; the final evaluations (`final=True`) become
  `valid_final/...` and `test_final/...`.

  The file is the log of one trajectory: each checkpoint stores how many
  records it had (`count`), and a run that resumes or rolls back to that
  checkpoint keeps exactly those (`truncate`), so that nothing a stopped or
  abandoned stretch logged is left twice, and a torn last line is dropped.
  """

  def __init__(self, workdir: str | pathlib.Path, keep: int = 0,
               resume_step: int | None = None, filename: str = METRICS_FILE):
    """Keeps the first `keep` records of the file (0: a new run, an empty
    file). `resume_step`: the step a resumed run continues from; TensorBoard
    hides the events past it (a new run: every earlier event). A checkpoint
    written before records were counted passes `keep=-1`: the records past
    `resume_step` and the final evaluations are dropped instead."""
    from tensorboardX import SummaryWriter  # imported here: a slow import
    self.path = pathlib.Path(workdir) / filename
    self.truncate(keep, resume_step)
    # A START event at resume_step + 1 (0 for a new run) makes TensorBoard
    # hide what was logged there before. The suffix keeps two writers
    # started within the same second from sharing a file name.
    self.events = SummaryWriter(str(pathlib.Path(workdir) / TENSORBOARD_DIR),
                                purge_step=0 if resume_step is None else resume_step + 1,
                                filename_suffix=f'.{time.time_ns()}')

  @property
  def count(self) -> int:
    """Records in the file: what a checkpoint taken now has logged."""
    return self._count

  def write(self, kind: str, **values) -> None:
    record = {'kind': kind, 'time': round(time.time(), 3), **values}
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')
    self._count += 1
    tag = f'{kind}_final' if values.get('final') else kind
    for name, value in values.items():
      # A diverged run's infinite perplexity stays in the JSON record only.
      if (name not in _INDEX_FIELDS and isinstance(value, Real)
          and not isinstance(value, bool) and math.isfinite(value)):
        self.events.add_scalar(f'{tag}/{name}', value, values.get('step', 0))
    self.events.flush()  # records are rare; a killed run keeps every one

  def truncate(self, count: int, step: int | None = None) -> None:
    """Keeps the first `count` records (a resume or rollback to a checkpoint
    that had logged them); with `count` -1, the records up to `step` but the
    final evaluations."""
    records = read_metrics(self.path) if self.path.exists() else []
    if count < 0:
      records = [r for r in records if r.get('step', 0) <= step and not r.get('final')]
    self._rewrite(records[:count] if count >= 0 else records)

  def close(self) -> None:
    self.events.close()

  def _rewrite(self, records: list[dict]) -> None:
    write_text_atomically(self.path, ''.join(json.dumps(r) + '\n' for r in records))
    self._count = len(records)


def read_metrics(path: str | pathlib.Path) -> list[dict]:
  """All records of a metrics file, but a last line a kill cut short."""
  with open(path) as f:
    lines = f.read().split('\n')
  # Every record ends in a newline: what follows the last one is a partial write.
  return [json.loads(line) for line in lines[:-1] if line.strip()]
