"""Hyper-parameter tuning on Optuna (`lm-zoo-tune`, `python launch/tune.py`).

`tuning_config()` is the base of every `experiments/tune_*.py` file;
`run_worker` runs a study's trials, on any number of machines sharing its
database; `write_report` tables the best trials and draws the neighbourhood
of the best one on parallel coordinates (the Mogrifier paper's Figs. 5, 6).
"""

import importlib

import ml_collections

from lm_zoo.configs import base_config, evaluation_config
from lm_zoo.tuning.spaces import (
  dyneval_table6,
  mogrifier_table4,
  mogrifier_table5,
  param,
  set_fields,
  suggest,
)

# What needs Optuna (the [tune] extra), imported on first use: tuning configs
# and `lm-zoo-tune --help` load without it.
_LAZY = {
  'best_so_far': 'report',
  'neighbourhood': 'report',
  'read_study': 'report',
  'write_report': 'report',
  'best_trial': 'study',
  'open_study': 'study',
  'run_worker': 'study',
  'storage_url': 'study',
  'study_counts': 'study',
  'trial_workdir': 'objectives',
}


def __getattr__(name: str):
  if name in _LAZY:
    return getattr(importlib.import_module(f'lm_zoo.tuning.{_LAZY[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def tuning_config() -> ml_collections.ConfigDict:
  """Every field of a tuning config (lm_zoo/tuning/study.py), with defaults."""
  c = ml_collections.ConfigDict()
  c.kind = 'train'  # train | dyneval
  c.space = ml_collections.ConfigDict()  # name -> spaces.param(...)
  c.base = base_config()  # kind train: what each trial trains
  c.dyneval = ml_collections.ConfigDict()  # kind dyneval
  c.dyneval.workdir = ''  # the trained model whose dynamic evaluation is tuned
  # Each trial scores valid with the 'dynamic' evaluator of this evaluation
  # config, the sampled values in place of its dynamic.* tuples, on the first
  # dynamic.search_tokens tokens (0: all).
  c.dyneval.evaluation = evaluation_config('dynamic')
  c.dyneval.evaluation.dynamic.update(rule='rms', search_tokens=10_000)
  c.study = ml_collections.ConfigDict()
  c.study.name = 'study'
  c.study.storage = ''  # a database URL; '': sqlite in the tuning work directory
  c.study.num_trials = 20  # in total, over every worker
  c.study.sampler = 'tpe'  # tpe | random
  c.study.startup_trials = 10  # tpe: random trials before the model guides sampling
  # >= 0: the sampler's seed (with the worker number and the trials done); -1: random
  c.study.seed = -1
  c.study.pruner = 'median'  # median | hyperband | halving | none
  c.study.pruner_startup_trials = 3  # median: trials that are never pruned
  c.study.pruner_warmup_steps = 0  # no pruning before this step (training steps)
  c.study.heartbeat_interval = 30  # seconds between a running trial's heartbeats
  c.study.grace_period = 120  # a trial silent this long is failed and retried
  c.study.max_retry = 3  # retries of one trial whose worker died or was preempted
  return c


# The names that need Optuna are documented where they live (lm_zoo.tuning.study,
# .objectives and .report) and reached here through __getattr__.
__all__ = [
  'dyneval_table6',
  'mogrifier_table4',
  'mogrifier_table5',
  'param',
  'set_fields',
  'suggest',
  'tuning_config',
]
