"""Metrics as JSON lines and TensorBoard scalars in the work directory."""

from __future__ import annotations

import json
import logging
import math
import pathlib
import time
from numbers import Real
from typing import Any, Sequence

import ml_collections

from lm_zoo.errors import ConfigError
from lm_zoo.runs.files import is_main_process, write_text_atomically

METRICS_FILE = 'metrics.jsonl'
TENSORBOARD_DIR = 'tensorboard'

log = logging.getLogger(__name__)
# Record fields that index a scalar rather than being one.
_INDEX_FIELDS = ('step', 'epoch', 'time', 'seed')


class MetricsWriter:
  """Appends one JSON object per line to `workdir/metrics.jsonl` and writes
  its numbers as TensorBoard scalars under `workdir/tensorboard` (with
  tensorboardX installed: `pip install 'lm_zoo[tensorboard]'`).

  A record `write('valid', step=9, perplexity=80.1)` becomes the scalar
  `valid/perplexity` at step 9; the final evaluations (`final=True`) become
  `valid_final/...` and `test_final/...`; a record of one of several seeds
  trained at once (`seed=3`) goes under `seed_3/valid/...`. `text` and
  `hyperparameters` go to TensorBoard only.

  The file is the log of one trajectory: each checkpoint stores how many
  records it had (`count`), and a run that resumes or rolls back to that
  checkpoint keeps exactly those (`truncate`), so that nothing a stopped or
  abandoned stretch logged is left twice, and a torn last line is dropped.

  On many hosts only process 0 writes; the others count the records they
  would have written, so that every process's `count` agrees.
  """

  def __init__(
    self,
    workdir: str | pathlib.Path,
    keep: int = 0,
    resume_step: int | None = None,
    filename: str = METRICS_FILE,
    writes: bool | None = None,
  ):
    """Keeps the first `keep` records of the file (0: a new run, an empty
    file). `resume_step`: the step a resumed run continues from; TensorBoard
    hides the events past it (a new run: every earlier event). `writes`:
    whether this process writes (None: when it is process 0)."""
    self.path = pathlib.Path(workdir) / filename
    self.writes = is_main_process() if writes is None else writes
    self.events = None
    if not self.writes:
      self._count = keep
      return
    self.truncate(keep)
    try:
      from tensorboardX import SummaryWriter  # imported here: a slow import
    except ImportError:
      log.info(
        'TensorBoard files are not written (tensorboardX is not installed: '
        "pip install 'lm_zoo[tensorboard]'); metrics.jsonl has every record"
      )
      return
    # A START event at resume_step + 1 (0 for a new run) makes TensorBoard
    # hide what was logged there before. The suffix keeps two writers
    # started within the same second from sharing a file name.
    self.events = SummaryWriter(
      str(pathlib.Path(workdir) / TENSORBOARD_DIR),
      purge_step=0 if resume_step is None else resume_step + 1,
      filename_suffix=f'.{time.time_ns()}',
    )

  @property
  def count(self) -> int:
    """Records in the file: what a checkpoint taken now has logged."""
    return self._count

  def write(self, kind: str, **values) -> None:
    self._count += 1
    if not self.writes:
      return
    record = {'kind': kind, 'time': round(time.time(), 3), **values}
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')
    if self.events is None:
      return
    tag = f'{kind}_final' if values.get('final') else kind
    if 'seed' in values:
      tag = f'seed_{values["seed"]}/{tag}'
    for name, value in values.items():
      # A diverged run's infinite perplexity stays in the JSON record only.
      if (
        name not in _INDEX_FIELDS
        and isinstance(value, Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
      ):
        self.events.add_scalar(f'{tag}/{name}', value, values.get('step', 0))
    self.events.flush()  # records are rare; a killed run keeps every one

  def text(self, tag: str, text: str, step: int) -> None:
    """`text` (markdown) under `tag` in TensorBoard's text tab."""
    if self.events is not None:
      self.events.add_text(tag, text, step)
      self.events.flush()

  def hyperparameters(
    self,
    config: ml_collections.ConfigDict,
    metrics: Sequence[str] = ('valid/perplexity', 'test_final/perplexity'),
  ) -> None:
    """The config's fields (dotted names) as the run's hyper-parameters in
    TensorBoard's HParams tab, beside `metrics` (scalar tags), and the whole
    config as text."""
    if self.events is None:
      return
    from tensorboardX.summary import hparams  # with tensorboardX, as SummaryWriter

    fields = {
      name: value if isinstance(value, (bool, int, float, str)) else str(value)
      for name, value in flat_fields(config).items()
    }
    experiment, session_start, _ = hparams(fields, {tag: 0.0 for tag in metrics})
    self.events.file_writer.add_summary(experiment)
    self.events.file_writer.add_summary(session_start)
    self.text('config', f'```\n{config.to_json_best_effort(indent=2)}\n```', 0)

  def truncate(self, count: int) -> None:
    """Keeps the first `count` records (a resume or rollback to a checkpoint
    that had logged them)."""
    if not self.writes:
      self._count = count
      return
    records = read_metrics(self.path) if self.path.exists() else []
    if len(records) < count:
      log.warning(
        '%s holds %d records where the checkpoint counted %d (deleted or cut '
        'short): the log goes on from what is left',
        self.path,
        len(records),
        count,
      )
    self._rewrite(records[:count])

  def close(self) -> None:
    if self.events is not None:
      self.events.close()

  def _rewrite(self, records: list[dict]) -> None:
    write_text_atomically(self.path, ''.join(json.dumps(r) + '\n' for r in records))
    self._count = len(records)


def flat_fields(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """A config's leaves by dotted name: {'model.mogrifier.rounds': 5, ...}."""
  fields = {}
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      fields.update(flat_fields(value, f'{prefix}{name}.'))
    else:
      fields[f'{prefix}{name}'] = value
  return fields


def read_metrics(path: str | pathlib.Path) -> list[dict]:
  """All records of a metrics file, but a last line a kill cut short.

  Raises:
    ConfigError: a complete line does not parse (the file was damaged),
      naming the file and the line.
  """
  with open(path, errors='replace') as f:
    lines = f.read().split('\n')
  # Every record ends in a newline: what follows the last one is a partial write.
  records = []
  for number, line in enumerate(lines[:-1], start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if not isinstance(record, dict):
      raise ConfigError(
        f'{path} is damaged at line {number}: {line[:60]!r} is not a record; '
        'restore the file, or delete that line to keep the rest'
      )
    records.append(record)
  return records
