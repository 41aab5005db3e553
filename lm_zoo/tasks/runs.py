"""One training run of a study, resumable: a finished run is read back from
its summary.json, an unfinished one resumes from its checkpoint, a diverged
one is recorded as a data point, and a run another worker is training is
waited for or left to it."""

from __future__ import annotations

import json
import logging
import pathlib

import ml_collections

from lm_zoo.errors import TrainingError, WorkdirInUse
from lm_zoo.training import train_and_evaluate
from lm_zoo.training.workdir import workdir_lock

log = logging.getLogger(__name__)


def train_or_read(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                  wait: bool = True) -> dict | None:
  """The run's summary, `{'diverged': True, 'error': ...}` if its loss
  turned non-finite; a run that ended before is read back, not trained.

  A run that another process is training (its work directory's lock is
  held) is waited for and read back when `wait`; otherwise it is left to
  that process and None is returned. If that process stopped before the
  end, this one resumes the run.
  """
  summary_path = workdir / 'summary.json'
  while True:
    if summary_path.is_file():
      return json.loads(summary_path.read_text())
    try:
      return train_and_evaluate(config, workdir)
    except WorkdirInUse as busy:
      if not wait:
        log.info('%s', busy)
        return None
      log.info('%s: waiting for it', busy)
      with workdir_lock(workdir, wait=True):
        pass
    except TrainingError as err:  # a data point of the study, not its end
      log.warning('%s diverged: %s', workdir, err)
      summary = {'diverged': True, 'error': str(err)}
      summary_path.write_text(json.dumps(summary, indent=2))
      return summary
