"""A throwaway PostgreSQL server for the tests of shared study databases.

Started from Debian's `postgresql` package (its binaries in
/usr/lib/postgresql/VERSION/bin, or on PATH) in a temporary folder, on a free
local port, trusting local connections; run as the `postgres` user when the
tests run as root (PostgreSQL refuses to run as root). `find_server` says why
a test must be skipped when there is none.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile
from typing import Iterator

USER = 'lm_zoo'


def _binaries() -> pathlib.Path | None:
  for folder in [
    *sorted(glob.glob('/usr/lib/postgresql/*/bin'), reverse=True),
    *([str(pathlib.Path(shutil.which('initdb')).parent)] if shutil.which('initdb') else []),
  ]:
    if all((pathlib.Path(folder) / name).exists() for name in ('initdb', 'pg_ctl')):
      return pathlib.Path(folder)
  return None


def find_server() -> tuple[pathlib.Path | None, str]:
  """(the folder of initdb and pg_ctl, '') or (None, why there is none)."""
  binaries = _binaries()
  if binaries is None:
    return None, (
      'PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run installs it)'
    )
  try:
    import psycopg2  # noqa: F401
  except ImportError:
    return None, "no PostgreSQL driver: pip install 'lm_zoo[postgres]'"
  if os.geteuid() == 0:
    try:
      pwd.getpwnam('postgres')
    except KeyError:
      return None, 'running as root, and there is no postgres user to run PostgreSQL as'
  return binaries, ''


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def postgres_server(binaries: pathlib.Path) -> Iterator[str]:
  """A running server; yields the SQLAlchemy URL of its `postgres` database."""
  folder = pathlib.Path(tempfile.mkdtemp(prefix='lm_zoo_pg_'))
  as_user: list[str] = []
  if os.geteuid() == 0:
    account = pwd.getpwnam('postgres')
    os.chown(folder, account.pw_uid, account.pw_gid)
    as_user = ['runuser', '-u', 'postgres', '--']
  data, port = folder / 'data', _free_port()
  run = lambda *args: subprocess.run(
    [*as_user, *map(str, args)], check=True, capture_output=True, text=True, timeout=120
  )
  run(binaries / 'initdb', '-D', data, '-U', USER, '-A', 'trust', '--no-sync')
  options = f'-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off'
  run(binaries / 'pg_ctl', '-D', data, '-o', options, '-l', folder / 'log', '-w', 'start')
  try:
    yield f'postgresql+psycopg2://{USER}@127.0.0.1:{port}/postgres'
  finally:
    subprocess.run(
      [*as_user, str(binaries / 'pg_ctl'), '-D', str(data), '-m', 'immediate', '-w', 'stop'],
      capture_output=True,
      timeout=120,
    )
    shutil.rmtree(folder, ignore_errors=True)


def new_database(server_url: str, name: str) -> str:
  """Creates database `name` on the server; returns its URL."""
  import sqlalchemy

  engine = sqlalchemy.create_engine(server_url, isolation_level='AUTOCOMMIT')
  with engine.connect() as connection:
    connection.execute(sqlalchemy.text(f'CREATE DATABASE {name}'))
  engine.dispose()
  return server_url.rsplit('/', 1)[0] + f'/{name}'
