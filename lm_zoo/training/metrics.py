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
  """

  def __init__(self, workdir: str | pathlib.Path, filename: str = METRICS_FILE,
               resume_step: int | None = None):
    """`resume_step`: the step a resumed run continues from. Its JSON records
    past that step are dropped, and TensorBoard hides the events past it."""
    from tensorboardX import SummaryWriter  # imported here: a slow import
    self.path = pathlib.Path(workdir) / filename
    if resume_step is not None:
      self._drop_after(resume_step)
    # A resumed run's START event at resume_step + 1 makes TensorBoard hide
    # what the stopped run logged past its checkpoint. The suffix keeps two
    # writers started within the same second from sharing a file name.
    self.events = SummaryWriter(str(pathlib.Path(workdir) / TENSORBOARD_DIR),
                                purge_step=None if resume_step is None else resume_step + 1,
                                filename_suffix=f'.{time.time_ns()}')

  def write(self, kind: str, **values) -> None:
    record = {'kind': kind, 'time': round(time.time(), 3), **values}
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')
    tag = f'{kind}_final' if values.get('final') else kind
    for name, value in values.items():
      # A diverged run's infinite perplexity stays in the JSON record only.
      if (name not in _INDEX_FIELDS and isinstance(value, Real)
          and not isinstance(value, bool) and math.isfinite(value)):
        self.events.add_scalar(f'{tag}/{name}', value, values.get('step', 0))
    self.events.flush()  # records are rare; a killed run keeps every one

  def close(self) -> None:
    self.events.close()

  def _drop_after(self, step: int) -> None:
    """Removes records past `step` and final evaluations (for a resumed run)."""
    if not self.path.exists():
      return
    keep = [r for r in read_metrics(self.path)
            if r.get('step', 0) <= step and not r.get('final')]
    write_text_atomically(self.path, ''.join(json.dumps(r) + '\n' for r in keep))


def read_metrics(path: str | pathlib.Path) -> list[dict]:
  """All records of a metrics file, but a last line a kill cut short."""
  with open(path) as f:
    lines = f.read().split('\n')
  # Every record ends in a newline: what follows the last one is a partial write.
  return [json.loads(line) for line in lines[:-1] if line.strip()]
