"""One training run of a study, or one stack of seeds, resumable: a finished
run is read back from its summary.json, an unfinished one resumes from its
checkpoint, a diverged run alone is recorded as a data point, and a run
another worker is training is waited for or left to it."""

from __future__ import annotations

import json
import logging
import pathlib
from typing import Any, Callable

import ml_collections

from lm_zoo.errors import TrainingError, WorkdirInUse
from lm_zoo.runs.files import SUMMARY_FILE, read_json, write_text_atomically
from lm_zoo.runs.workdir import workdir_lock
from lm_zoo.training import train_and_evaluate

log = logging.getLogger(__name__)


def train_or_read(
  config: ml_collections.ConfigDict, workdir: pathlib.Path, wait: bool = True
) -> dict | None:
  """The run's summary, `{'diverged': True, 'error': ...}` if its loss
  turned non-finite; a run that ended before is read back, not trained.

  A run that another process is training (its work directory's lock is
  held) is waited for and read back when `wait`; otherwise it is left to
  that process and None is returned. If that process stopped before the
  end, this one resumes the run.
  """

  def train() -> dict:
    try:
      return train_and_evaluate(config, workdir)
    except TrainingError as err:  # a data point of the study, not its end
      log.warning('%s diverged: %s', workdir, err)
      summary = {'diverged': True, 'error': str(err)}
      write_text_atomically(workdir / SUMMARY_FILE, json.dumps(summary, indent=2))
      return summary

  return _read_or_run(train, workdir, wait)


def train_stack_or_read(
  config: ml_collections.ConfigDict, workdir: pathlib.Path, num_seeds: int, wait: bool = True
) -> dict | None:
  """`train_and_evaluate(config, workdir, num_seeds=num_seeds)`'s summary, read back if the
  stack ended before; waited for or left to another process as
  `train_or_read` does.

  Raises:
    TrainingError: a seed's loss turned non-finite, which stops the stack.
  """
  return _read_or_run(
    lambda: train_and_evaluate(config, workdir, num_seeds=num_seeds), workdir, wait
  )


def _read_or_run(
  run: Callable[[], dict[str, Any]], workdir: pathlib.Path, wait: bool
) -> dict | None:
  summary_path = workdir / SUMMARY_FILE
  while True:
    if summary_path.is_file():
      return read_json(summary_path, 'a finished run keeps its summary')
    try:
      return run()
    except WorkdirInUse as busy:
      if not wait:
        log.info('%s', busy)
        return None
      log.info('%s: waiting for it', busy)
      with workdir_lock(workdir, wait=True):
        pass
