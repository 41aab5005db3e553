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
