"""The command-line programs (`lm-zoo-train`, `lm-zoo-eval`, `lm-zoo-generate`,
`lm-zoo-download`, also run as `python launch/NAME.py`) and their shared set-up.

Each program is a module of this package that defines its absl flags when
imported, so import one per process (through `main`), never two.
"""

import logging
import sys
import types
from typing import Callable, TypeVar

from absl import app, flags
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


def main(command: types.ModuleType, program: Callable[[list[str]], None],
         more_help: str = '') -> None:
  """Runs `program` under absl as the process's main program.

  `--help` shows `command`'s docstring and its flags whether the process was
  started as `python launch/NAME.py` or as an installed console script (absl
  lists only the flags of the module it was started from), then `more_help`.
  """
  program_path = sys.argv[0]
  for flag in flags.FLAGS.get_flags_for_module(command.__name__):
    flags.FLAGS.register_key_flag_for_module(program_path, flag)
  sys.modules['__main__'].__doc__ = command.__doc__ + more_help
  app.run(program)
