"""The evaluators' settings checked where they are made (the classes'
`__post_init__`): each error one line naming the attribute, which the
registry prefixes with its config section ('static.temperature')."""

from __future__ import annotations

import math
from typing import Any

from lm_zoo.errors import ConfigError, is_whole_number


def check_whole(value: Any, name: str, least: int, meaning: str = '') -> None:
  """Raises ConfigError unless `value` is a whole number >= `least`."""
  if not is_whole_number(value) or value < least:
    raise ConfigError(f'{name} must be a whole number >= {least}{meaning}, got {value!r}')


def is_number(value: Any) -> bool:
  """A real number, not a bool (which Python counts as one) nor NaN."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def check_temperature(value: Any) -> None:
  """Raises ConfigError unless the temperature `value` is one finite number
  > 0: a Python, NumPy or JAX scalar, not a bool or a string."""
  try:
    number = None if isinstance(value, (bool, str)) else float(value)
  except (TypeError, ValueError):
    number = None
  if number is None or not (math.isfinite(number) and number > 0):
    raise ConfigError(f'temperature must be a positive number, got {value}')


def check_windows(bptt: Any, batch_size: Any = 1, max_tokens: Any = 0) -> None:
  """The stream's cut every evaluator shares: windows of `bptt` tokens,
  `batch_size` rows, the first `max_tokens` tokens (0: all)."""
  check_whole(bptt, 'bptt', 1)
  check_whole(batch_size, 'batch_size', 1)
  check_whole(max_tokens, 'max_tokens', 0, ' (0: the whole split)')


def check_grid(values: Any, name: str) -> None:
  """Raises ConfigError unless `values` is one or more finite numbers >= 0
  (a searched setting of dynamic evaluation)."""
  if (
    not isinstance(values, (tuple, list))
    or not values
    or not all(is_number(v) and math.isfinite(v) and v >= 0 for v in values)
  ):
    raise ConfigError(f'{name} must be one or more numbers >= 0, got {values}')
