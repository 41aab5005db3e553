"""When a run ends: the updates it plans, its step and time budgets, and
whether a run started again has already finished."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import ml_collections

from lm_zoo.data import BatchedStream
from lm_zoo.runs.files import SUMMARY_FILE, read_json
from lm_zoo.training.run import Progress

log = logging.getLogger(__name__)


def training_done(
  config: ml_collections.ConfigDict, progress: Progress, step: int, seconds: float
) -> bool:
  """Whether the epochs or a budget (train.max_steps, train.max_seconds) ran
  out, `step` updates and `seconds` of training into the run."""
  return progress.epoch > config.train.num_epochs or budget_spent(config, step, seconds)


def completed_summary(
  config: ml_collections.ConfigDict, workdir: pathlib.Path, step: int, progress: Progress
) -> dict[str, Any] | None:
  """The summary of a run that finished at the restored `step`, or None: a
  finished run run again is left as it is (not scored again, its times and
  metrics kept), unless it stopped before its summary was written."""
  summary_file = workdir / SUMMARY_FILE
  if not training_done(config, progress, step, progress.train_seconds):
    return None
  summary = (
    read_json(summary_file, 'a finished run keeps its summary') if summary_file.exists() else {}
  )
  if summary.get('step') != step:
    return None
  # At an epoch's start the one before is done; else the budget stopped it inside one.
  where = (
    f'after epoch {progress.epoch - 1}' if progress.position == 0 else f'in epoch {progress.epoch}'
  )
  log.info(
    'The run in %s is already complete (%d steps, %s); its summary is in %s. '
    'To train for longer, raise train.num_epochs (or the budget) in the same '
    'command; to score it, use lm-zoo-eval',
    workdir,
    step,
    where,
    summary_file,
  )
  return summary


def budget_spent(config: ml_collections.ConfigDict, step: int, seconds: float) -> bool:
  """Whether train.max_steps or train.max_seconds (when > 0) is used up,
  `step` updates and `seconds` of training into the run."""
  cfg = config.train
  return (cfg.max_steps > 0 and step >= cfg.max_steps) or (
    cfg.max_seconds > 0 and seconds >= cfg.max_seconds
  )


def planned_steps(config: ml_collections.ConfigDict, batched: BatchedStream) -> int:
  """Updates in the whole run: every epoch's windows, at most train.max_steps."""
  data_cfg = config.data
  total = sum(
    batched.num_windows(data_cfg.bptt, data_cfg.variable_bptt, seed=(config.seed, epoch))
    for epoch in range(1, config.train.num_epochs + 1)
  )
  return min(total, config.train.max_steps) if config.train.max_steps > 0 else total
