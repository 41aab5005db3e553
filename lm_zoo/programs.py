"""The console scripts (`lm-zoo-train`, `lm-zoo-eval`, ...) and the
launch/ shims start here. Each program's module reads its absl flags and
its --config file (with the --config.FIELD overrides) as it is imported, and
importing it loads JAX, which takes seconds: both happen inside the error
handling here, so that a bad --config file, variant or field, and Ctrl-C
while the libraries load, are one line and not a traceback. This module
imports nothing else at the top but lm_zoo.interrupts (the standard library
only), so that Ctrl-C is handled from the start: while the program's module
loads it is deferred (an extension interrupted mid-import prints a traceback
of its own), then the program exits as interrupted.
"""

import importlib
import pathlib
import signal
import sys

from lm_zoo.interrupts import (
  defer_interrupts,
  interrupt_from_unraisable,
  interrupted,
  raise_interrupts,
)


def _launch(name: str) -> None:
  """Imports `lm_zoo.cli.NAME` and runs its `main()`."""
  sys.unraisablehook = interrupt_from_unraisable
  defer_interrupts()  # until the libraries have loaded
  sys.argv[1:] = installed_configs(sys.argv[1:])
  try:
    program = importlib.import_module(f'lm_zoo.cli.{name}')
  except KeyboardInterrupt:
    print('interrupted', file=sys.stderr)
    sys.exit(128 + signal.SIGINT)
  except Exception as err:  # the flags and the --config file, read on import
    # Ctrl-C while the libraries load (deferred), or one wrapped in an
    # extension's ImportError.
    if interrupted() or _caused_by_interrupt(err):
      print('interrupted', file=sys.stderr)
      sys.exit(128 + signal.SIGINT)
    if '--verbose' in sys.argv[1:]:
      raise
    from lm_zoo.errors import missing_extra

    if missing_extra(err):
      print(f'error: {missing_extra(err)}', file=sys.stderr)
      sys.exit(1)
    from lm_zoo.cli import flag_error

    print(f'error: {flag_error(err, sys.argv)}\nPass --help to see the flags.', file=sys.stderr)
    sys.exit(1)
  if interrupted():
    print('interrupted', file=sys.stderr)
    sys.exit(128 + signal.SIGINT)
  raise_interrupts()
  program.main()


def _caused_by_interrupt(err: BaseException | None) -> bool:
  """Whether a KeyboardInterrupt is in `err`'s chain of causes (a C
  extension interrupted while it loads raises ImportError from it)."""
  seen = set()
  while err is not None and id(err) not in seen:
    if isinstance(err, KeyboardInterrupt):
      return True
    seen.add(id(err))
    err = err.__cause__ or err.__context__
  return False


# The flags that name a config file, in the --flag=PATH[:VARIANT] form.
_CONFIG_FLAGS = ('--config=', '--tune=')


def installed_configs(args: list[str]) -> list[str]:
  """`args` with each --config=experiments/NAME.py[:VARIANT] (or --tune=)
  that names no file here naming the config installed with the package
  instead: the README's commands work outside a checkout too."""
  experiments = pathlib.Path(__file__).resolve().parent / 'experiments'
  rewritten = []
  for arg in args:
    flag = next((f for f in _CONFIG_FLAGS if arg.startswith(f)), None)
    if flag is not None:
      path, colon, variant = arg[len(flag) :].partition(':')
      local = pathlib.Path(path)
      if (
        not local.exists()
        and local.parts[:1] == ('experiments',)
        and (experiments / local.relative_to('experiments')).is_file()
      ):
        arg = f'{flag}{experiments / local.relative_to("experiments")}{colon}{variant}'
    rewritten.append(arg)
  return rewritten


def train() -> None:
  _launch('train')


def evaluate() -> None:
  _launch('evaluate')


def generate() -> None:
  _launch('generate')


def download() -> None:
  _launch('download')


def tune() -> None:
  _launch('tune')


def meta_train() -> None:
  _launch('meta_train')


def plot() -> None:
  _launch('plot')


def task() -> None:
  _launch('task')


def export() -> None:
  _launch('export')
