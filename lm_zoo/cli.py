"""Shared set-up for the launch scripts."""

import logging
import sys
from typing import Callable, TypeVar

from absl import logging as absl_logging

from lm_zoo.errors import LMZooError

T = TypeVar('T')


def run(job: Callable[[], T]) -> T:
  """Runs `job` with lm_zoo's progress shown and its errors as one clear line.

  lm_zoo's INFO lines go to the console; libraries' (orbax's) only from WARNING.
  An `LMZooError` ends the process with its message instead of a traceback.
  """
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('lm_zoo').setLevel(logging.INFO)
  try:
    return job()
  except LMZooError as err:
    sys.exit(f'error: {err}')
