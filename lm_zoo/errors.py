"""Errors that carry a message meant for the person running lm_zoo.

Launch scripts catch `LMZooError` and print its message instead of a traceback.
`is_whole_number` is the test the refusals of sizes and counts share.
"""

import numbers
from typing import Any


def is_whole_number(value: Any) -> bool:
  """Whether `value` is an integer: not a float, and not a bool, which
  Python counts as one."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class LMZooError(Exception):
  """Base class: the message says what went wrong and what to do about it."""


class DataError(LMZooError, ValueError):
  """A corpus could not be found, read or decoded."""


class ConfigError(LMZooError, ValueError):
  """A configuration names something unknown or impossible."""


class TrainingError(LMZooError, RuntimeError):
  """Training cannot go on (for example, the loss is not finite)."""


class CheckpointError(LMZooError):
  """A checkpoint is corrupt or truncated and cannot be read."""


class WorkdirInUse(LMZooError):
  """Another process holds a work directory's lock (it is training there, or
  scoring an evaluation of a study)."""


class Preempted(LMZooError):
  """Training stopped on a signal (SIGTERM, SIGINT) after saving a checkpoint.

  Attributes:
    signum: the signal's number; the programs exit with status 128 + signum,
      as a shell reports a process that signal stopped.
  """

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.signum = signum


# The optional dependencies' top-level modules -> the extra of pyproject.toml
# that installs them.
OPTIONAL_MODULES = {
  'optuna': 'tune',
  'sqlalchemy': 'tune',
  'matplotlib': 'plot',
  'tensorboardX': 'tensorboard',
  'tensorflow_datasets': 'tfds',
  'array_record': 'tfds',
  'psycopg2': 'postgres',
  'huggingface_hub': 'hub',
}


def missing_extra(err: ImportError) -> str | None:
  """What to install when `err` is an optional dependency that is missing
  (one line), else None: a missing module of its own is a bug."""
  module = (getattr(err, 'name', None) or '').split('.')[0]
  if not isinstance(err, ModuleNotFoundError) or module not in OPTIONAL_MODULES:
    return None
  extra = OPTIONAL_MODULES[module]
  return f"this needs {module}, which is not installed: pip install 'lm_zoo[{extra}]'"
