"""A warm Python for a shell script that runs many Python processes one after
another (the GPU run kit's tiny run, tests/test_gpu_run_kit.py): a server that
imported JAX and lm_zoo once forks a child for each command line, which runs
it as `python ARGS` would, in the client's folder and environment, on its
stdin, stdout and stderr; the client exits with the child's status. The
seconds each interpreter spends importing JAX and lm_zoo are spent once.

  python tests/warm_python.py --serve SOCKET          # prints 'ready' once listening
  python -S tests/warm_python.py SOCKET ARGS...       # as `python ARGS`

ARGS is a script and its arguments, `-c CODE`, `-m MODULE` or `-` (the code
on stdin), each with its arguments; other interpreter options are refused.
The client imports only the standard library (-S: it starts in milliseconds).
"""

import contextlib
import json
import os
import signal
import socket
import struct
import sys

_LENGTH = struct.Struct('!i')


def _read(conn: socket.socket, size: int) -> bytes:
  data = b''
  while len(data) < size:
    chunk = conn.recv(size - len(data))
    if not chunk:
      raise ConnectionError('the other end closed the connection')
    data += chunk
  return data


def client(path: str, args: list[str]) -> None:
  request = json.dumps({'args': args, 'cwd': os.getcwd(), 'env': dict(os.environ)}).encode()
  with socket.socket(socket.AF_UNIX) as conn:
    conn.connect(path)
    socket.send_fds(conn, [b'.'], [0, 1, 2])
    conn.sendall(_LENGTH.pack(len(request)) + request)
    (code,) = _LENGTH.unpack(_read(conn, _LENGTH.size))
  if code < 0:  # killed by signal -code: so is the client, as the shell would see it
    os.kill(os.getpid(), -code)
  sys.exit(code if code >= 0 else 128 - code)


def _run(request: dict, fds: list[int]) -> None:
  """In the forked child: becomes `python ARGS` in the client's place, then
  exits as the interpreter does (an uncaught exception: its traceback, 1)."""
  import runpy
  import types

  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  os.chdir(request['cwd'])
  os.environ.clear()
  os.environ.update(request['env'])
  if os.environ.get('PYTHONUNBUFFERED'):
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
  option, *rest = request['args'] or ['-']
  if option in ('-c', '-'):  # sys.path[0] and sys.argv[0] as the interpreter sets them
    code = rest.pop(0) if option == '-c' else sys.stdin.read()
    sys.argv, sys.path[0] = [option, *rest], ''
    main = types.ModuleType('__main__')
    sys.modules['__main__'] = main
    exec(compile(code, '<string>' if option == '-c' else '<stdin>', 'exec'), main.__dict__)
  elif option == '-m':
    sys.argv, sys.path[0] = [rest[0], *rest[1:]], os.getcwd()
    runpy._run_module_as_main(rest[0])  # as `python -m` runs it (argv[0]: its file)
  elif option.startswith('-'):
    sys.exit(f'warm_python: interpreter option {option} is not supported')
  else:
    sys.argv, sys.path[0] = [option, *rest], os.path.dirname(os.path.abspath(option))
    runpy.run_path(option, run_name='__main__')
  sys.exit(0)


def serve(path: str) -> None:
  import importlib

  for module in ('lm_zoo.cli', 'lm_zoo.training', 'lm_zoo.evaluation', 'lm_zoo.generation'):
    importlib.import_module(module)  # no JAX backend yet: its threads would not fork
  listener = socket.socket(socket.AF_UNIX)
  listener.bind(path)
  listener.listen()
  print('ready', flush=True)
  while True:  # one command line at a time, as the script runs them
    conn, _ = listener.accept()
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    (size,) = _LENGTH.unpack(_read(conn, _LENGTH.size))
    request = json.loads(_read(conn, size))
    sys.stdout.flush()
    if os.fork() == 0:
      listener.close()
      conn.close()
      _run(request, fds)  # never returns
    for fd in fds:
      os.close(fd)
    _, status = os.wait()
    conn.sendall(_LENGTH.pack(os.waitstatus_to_exitcode(status)))
    conn.close()


@contextlib.contextmanager
def warm_python(env: dict[str, str]):
  """A server started with `env`, the environment of the script that will
  call it, as the GPU run kit gives it to its programs (this checkout first
  on PYTHONPATH, PYTHONUNBUFFERED), so that JAX and lm_zoo are imported as
  they would be: yields the path of an executable to give the script as its
  Python. The server and any child left are killed at the end."""
  import subprocess
  import tempfile

  with tempfile.TemporaryDirectory(prefix='warm_python_') as folder:  # a short socket path
    path = os.path.join(folder, 'socket')
    python = os.path.join(folder, 'python')
    with open(python, 'w') as f:
      f.write(f'#!/bin/sh\nexec {sys.executable} -S {os.path.abspath(__file__)} {path} "$@"\n')
    os.chmod(python, 0o755)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
      **env,
      'PYTHONUNBUFFERED': '1',
      'PYTHONPATH': os.pathsep.join(filter(None, [repo, env.get('PYTHONPATH')])),
    }
    server = subprocess.Popen(
      [sys.executable, __file__, '--serve', path],
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      text=True,
      start_new_session=True,
    )
    try:
      assert server.stdout.readline() == 'ready\n', 'the warm Python did not start'
      yield python
    finally:
      os.killpg(server.pid, signal.SIGKILL)
      server.wait()
      server.stdout.close()


if __name__ == '__main__':
  if sys.argv[1] == '--serve':
    serve(sys.argv[2])
  else:
    client(sys.argv[1], sys.argv[2:])
