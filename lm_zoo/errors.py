"""Errors that carry a message meant for the person running lm_zoo.

Launch scripts catch `LMZooError` and print its message instead of a traceback.
"""


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
  """Another process holds the work directory's lock (it is training there)."""


class Preempted(LMZooError):
  """Training stopped on a signal (SIGTERM, SIGINT) after saving a checkpoint.

  Attributes:
    signum: the signal's number; the programs exit with status 128 + signum,
      as a shell reports a process that signal stopped.
  """

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.signum = signum
