"""One training run of a study, resumable: a finished run is read back from
its summary.json, an unfinished one resumes from its checkpoint, a diverged
one is recorded as a data point."""

from __future__ import annotations

import json
import logging
import pathlib

import ml_collections

from lm_zoo.errors import TrainingError
from lm_zoo.training import train_and_evaluate

log = logging.getLogger(__name__)


def train_or_read(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict:
  """The run's summary, `{'diverged': True, 'error': ...}` if its loss
  turned non-finite; a run that ended before is read back, not trained."""
  summary_path = workdir / 'summary.json'
  if summary_path.is_file():
    return json.loads(summary_path.read_text())
  try:
    return train_and_evaluate(config, workdir)
  except TrainingError as err:  # a data point of the study, not its end
    log.warning('%s diverged: %s', workdir, err)
    summary = {'diverged': True, 'error': str(err)}
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary
