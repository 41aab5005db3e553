"""Runs one lm_zoo program on many command lines in one process: the program
's libraries are imported once (JAX loads in seconds), then each command
line runs in a forked child as the console script runs it: the program's
module imported with sys.argv set (config_flags reads --config there), its
own flags, stdout and stderr.

  python tests/program_probes.py PROGRAM < command_lines.json > results.json

The input is a JSON list of argument lists; the output a JSON list of
{"status", "stdout", "stderr"}, one per command line, in order.
"""

import importlib
import json
import os
import sys
import tempfile

# A command line that runs longer than this is a hang.
TIME_LIMIT_S = int(os.environ.get("PROBE_TIME_LIMIT_S", 120))


def _run_in_child(name: str, args: list[str], folder: str) -> dict:
  from lm_zoo.interrupts import interrupt_from_unraisable
  from lm_zoo.programs import installed_configs
  out, err = os.path.join(folder, 'stdout'), os.path.join(folder, 'stderr')
  pid = os.fork()
  if pid == 0:
    try:
      sys.stdout.flush()
      for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
      os.environ['PYTHONUNBUFFERED'] = '1'
      import signal
      signal.alarm(TIME_LIMIT_S)
      sys.unraisablehook = interrupt_from_unraisable
      sys.argv = [name, *installed_configs(args)]
      importlib.import_module(f'lm_zoo.cli.{name}').main()
      code = 0
    except SystemExit as stopped:
      code = (0 if stopped.code is None else stopped.code if isinstance(stopped.code, int)
              else 1)
    except BaseException:  # what the console script would print and exit 1 with
      import traceback
      traceback.print_exc()
      code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  _, status = os.waitpid(pid, 0)
  with open(out) as o, open(err) as e:
    return {'status': os.waitstatus_to_exitcode(status), 'stdout': o.read(),
            'stderr': e.read()}


def main() -> None:
  name = sys.argv[1]
  for module in ('lm_zoo.cli', 'lm_zoo.training', 'lm_zoo.evaluation', 'lm_zoo.generation'):
    importlib.import_module(module)
  command_lines = json.load(sys.stdin)
  results = []
  with tempfile.TemporaryDirectory() as folder:
    for args in command_lines:
      results.append(_run_in_child(name, args, folder))
  json.dump(results, sys.stdout)


if __name__ == '__main__':
  main()
