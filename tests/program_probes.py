"""Runs many command lines in one process: lm_zoo's libraries are imported
once (JAX loads in seconds), then each command line runs in a forked child,
with its own sys.argv, exit status, stdout and stderr.

  python tests/program_probes.py PROGRAM < command_lines.json > results.json
  python tests/program_probes.py --programs < command_lines.json > results.json
  python tests/program_probes.py --scripts < command_lines.json > results.json

With PROGRAM, each command line is that lm_zoo program's arguments, run as
its console script runs them (the program's module imported with sys.argv
set: config_flags reads --config there); with --programs, each is a
program's name, then its arguments. With --scripts, each is a script's
path and its arguments, run as `python SCRIPT ARGS` runs them (as
`__main__`). The input is a JSON list of argument lists; the output a JSON
list of {"status", "stdout", "stderr"}, one per command line, in order.
"""

import importlib
import json
import os
import runpy
import sys
import tempfile
from typing import Callable

# A command line that runs longer than this is a hang.
TIME_LIMIT_S = int(os.environ.get('PROBE_TIME_LIMIT_S', 120))


def _exit_status(stopped: SystemExit) -> int:
  """The status the interpreter exits with on `stopped`, printing a message
  it carries as the interpreter does."""
  if stopped.code is None:
    return 0
  if isinstance(stopped.code, int):
    return stopped.code
  print(stopped.code, file=sys.stderr)
  return 1


def _run_in_child(run: Callable[[], None], folder: str) -> dict:
  out, err = os.path.join(folder, 'stdout'), os.path.join(folder, 'stderr')
  sys.stdout.flush()
  pid = os.fork()
  if pid == 0:
    try:
      for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
      os.environ['PYTHONUNBUFFERED'] = '1'
      import signal

      signal.alarm(TIME_LIMIT_S)
      run()
      code = 0
    except SystemExit as stopped:
      code = _exit_status(stopped)
    except BaseException:  # what the interpreter would print and exit 1 with
      import traceback

      traceback.print_exc()
      code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  _, status = os.waitpid(pid, 0)
  with open(out) as o, open(err) as e:
    return {'status': os.waitstatus_to_exitcode(status), 'stdout': o.read(), 'stderr': e.read()}


def _program(name: str, args: list[str]) -> Callable[[], None]:
  def run():
    from lm_zoo.interrupts import interrupt_from_unraisable
    from lm_zoo.programs import installed_configs

    sys.unraisablehook = interrupt_from_unraisable
    sys.argv = [name, *installed_configs(args)]
    importlib.import_module(f'lm_zoo.cli.{name}').main()

  return run


def _script(args: list[str]) -> Callable[[], None]:
  def run():
    sys.argv = list(args)
    runpy.run_path(args[0], run_name='__main__')

  return run


def main() -> None:
  name = sys.argv[1]
  for module in ('lm_zoo.cli', 'lm_zoo.training', 'lm_zoo.evaluation', 'lm_zoo.generation'):
    importlib.import_module(module)
  command_lines = json.load(sys.stdin)
  results = []
  with tempfile.TemporaryDirectory() as folder:
    for args in command_lines:
      if name == '--scripts':
        run = _script(args)
      else:
        run = _program(args[0], args[1:]) if name == '--programs' else _program(name, args)
      results.append(_run_in_child(run, folder))
  json.dump(results, sys.stdout)


if __name__ == '__main__':
  main()
