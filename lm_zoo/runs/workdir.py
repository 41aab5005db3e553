"""A training run's work directory as the run writes it: named and checked
(`check_workdir`, `refuse_links`), locked to one process (`workdir_lock`),
its config, data fingerprint, vocabulary and seeds saved, and whether a
config may resume it (`check_resumable`). `lm_zoo.runs.finished` reads
them back."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import pathlib
import socket
from typing import Iterator

import jax
import ml_collections

from lm_zoo.data import Corpus
from lm_zoo.errors import ConfigError, WorkdirInUse
from lm_zoo.runs.checkpoints import FORMAT_VERSION
from lm_zoo.runs.files import (
  COMMANDS_FILE,
  CONFIG_FILE,
  DATA_FILE,
  LOCK_FILE,
  SEEDS_FILE,
  VOCAB_FILE,
  is_main_process,
  sync_processes,
  write_text_atomically,
)
from lm_zoo.runs.finished import check_data, load_config, load_seeds
from lm_zoo.runs.metrics import flat_fields
from lm_zoo.version import FORMAT_KEY, WRITER_KEY, __version__

log = logging.getLogger(__name__)

# Fields that fix the shapes of a checkpoint: a run cannot resume across them.
SHAPE_FIELDS = (
  'model.cell',
  'model.num_layers',
  'model.embed_size',
  'model.embed_ratio',
  'model.hidden_size',
  'model.output_size',
  'model.param_budget',
  'model.tie_embeddings',
  'model.recurrent_bias',
  'model.mogrifier',
  'model.alstm',
  'model.dual.size',
  'model.head',
  'model.mos.components',
  'data.name',
  'data.batch_size',
  'optimizer.name',
  'averaging.trigger',
)
# Sections whose other fields change how the rest of a resumed run trains:
# allowed, and logged as a warning.
DYNAMICS_SECTIONS = ('model', 'optimizer', 'schedule', 'data')


def check_workdir(workdir: str | pathlib.Path) -> pathlib.Path:
  """`workdir` as a path, once it can hold a run: named (an empty name would
  be the current folder), a folder or not there yet, and either empty or
  holding a run lm_zoo started (its config.json, lock or checkpoints), with
  no symbolic link inside (`refuse_links`).

  Raises:
    ConfigError: one line naming the folder and what to do.
  """
  if not str(workdir).strip():
    raise ConfigError(
      'the work directory is empty: name a folder for the run (--workdir=runs/NAME)'
    )
  workdir = pathlib.Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f'--workdir={workdir} is a file, not a folder: name a folder for the run')
  if workdir.is_dir():
    entries = sorted(p.name for p in workdir.iterdir())
    if entries and not {CONFIG_FILE, LOCK_FILE, 'checkpoints'} & set(entries):
      shown = ', '.join(entries[:3]) + (f' and {len(entries) - 3} more' if len(entries) > 3 else '')
      raise ConfigError(
        f'{workdir} holds files lm_zoo did not write ({shown}): train in a new or empty folder'
      )
    refuse_links(workdir)
  return workdir


def _link_error(path: pathlib.Path) -> ConfigError:
  return ConfigError(
    f'{path} is a symbolic link: lm_zoo writes nothing through links '
    'inside a work directory; remove it, or use a new --workdir'
  )


def refuse_links(workdir: pathlib.Path) -> None:
  """Raises ConfigError naming the first symbolic link inside `workdir`:
  lm_zoo writes nothing through a link, which could point out of the work
  directory (the folder itself may be a link)."""
  for folder, dirs, files in os.walk(workdir):
    for name in sorted(dirs + files):
      path = pathlib.Path(folder) / name
      if path.is_symlink():
        raise _link_error(path)


@contextlib.contextmanager
def workdir_lock(workdir: pathlib.Path, wait: bool = False) -> Iterator[None]:
  """Holds `workdir`'s lock for the duration: two runs training in one work
  directory would overwrite each other's checkpoints and metrics. Process 0
  takes an flock on the folder itself and on WORKDIR/lock, which names the
  holder's host and pid; the folder's lock still holds when the file is
  removed by hand. The kernel releases both when the process ends, however
  it ends, so a killed run leaves nothing to clean up. (flock is per host:
  on a network file system mounted by several hosts it may not exclude
  them.) The processes of one multi-process run share the work directory:
  process N takes WORKDIR/lock.N alone.

  Args:
    wait: block until the lock is free instead of raising.

  Raises:
    WorkdirInUse: another process holds it (and `wait` is False).
    ConfigError: the lock file is a symbolic link.
  """
  workdir.mkdir(parents=True, exist_ok=True)
  index = jax.process_index()
  path = workdir / (f'{LOCK_FILE}.{index}' if index else LOCK_FILE)
  busy = (
    f'{workdir} is in use by {{holder}}: wait for that run to end, or train in another --workdir'
  )
  with contextlib.ExitStack() as held:
    if index == 0:
      folder = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
      held.callback(os.close, folder)
      _flock(folder, wait, busy, path)
    held.enter_context(file_lock(path, wait, busy))
    yield


@contextlib.contextmanager
def file_lock(path: pathlib.Path, wait: bool, busy: str) -> Iterator[None]:
  """Holds an exclusive flock on the file `path` (made if missing, never
  through a link) for the duration, its text naming the holder's host and
  pid. The kernel releases it when the process ends, however it ends.

  Args:
    wait: block until the lock is free instead of raising.
    busy: the message when another process holds it, '{holder}' standing
      for the holder the file names.

  Raises:
    WorkdirInUse: another process holds it (and `wait` is False).
    ConfigError: `path` is a symbolic link.
  """
  try:  # never through a link: the pid written into it would land elsewhere
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
  except OSError as err:
    if err.errno == errno.ELOOP:
      raise _link_error(path) from None
    raise
  with os.fdopen(descriptor, 'r+') as f:
    _flock(f.fileno(), wait, busy, path)
    f.seek(0)
    f.truncate()
    f.write(f'pid {os.getpid()} on host {socket.gethostname()}\n')
    f.flush()
    yield


def _flock(descriptor: int, wait: bool, busy: str, path: pathlib.Path) -> None:
  """Takes an exclusive flock on `descriptor` (held until it is closed), or
  raises WorkdirInUse with `busy` naming the holder from the lock file at
  `path`."""
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
  except BlockingIOError:
    try:
      holder = path.read_text().strip()
    except OSError:
      holder = ''
    holder = holder or 'another process (its lock file was removed)'
    raise WorkdirInUse(busy.replace('{holder}', holder)) from None


def record_command(workdir: pathlib.Path, command: str) -> None:
  """Appends `command` (one line) to WORKDIR/commands.txt after the UTC time,
  lm_zoo's version and the folder it ran in: every command line that trained
  in the work directory, in order (process 0 of many). Call it holding the
  work directory's lock."""
  if not is_main_process():
    return
  when = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
  line = f'{when} lm_zoo {__version__} in {os.getcwd()}: {" ".join(command.splitlines())}\n'
  path = workdir / COMMANDS_FILE
  try:  # never through a link (`refuse_links`)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
  except OSError as err:
    if err.errno == errno.ELOOP:
      raise _link_error(path) from None
    raise
  with os.fdopen(descriptor, 'a') as f:
    f.write(line)


def save_config(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
  """Writes WORKDIR/config.json with the format it is written in (process
  0 of many)."""
  if is_main_process():
    saved = {
      FORMAT_KEY: FORMAT_VERSION,
      WRITER_KEY: __version__,
      **json.loads(config.to_json_best_effort()),
    }
    write_text_atomically(workdir / CONFIG_FILE, json.dumps(saved, indent=2))
  sync_processes('lm_zoo config saved')


def record_data(corpus: Corpus, workdir: pathlib.Path) -> None:
  """Writes the corpus' fingerprint to WORKDIR/data.json (`Corpus.fingerprint`)
  and its vocabulary to WORKDIR/vocab.json, so that the run can be used
  without its data (`lm_zoo.load`); or, when the run has them, refuses a
  corpus that differs. Process 0 of many writes them."""
  path = workdir / DATA_FILE
  if path.is_file():
    check_data(corpus, workdir)
  elif is_main_process():
    write_text_atomically(
      workdir / VOCAB_FILE,
      json.dumps({'kind': corpus.vocab.kind, 'tokens': list(corpus.vocab.tokens)}),
    )
    write_text_atomically(path, json.dumps(corpus.fingerprint(), indent=2))
  sync_processes('lm_zoo data recorded')


def check_resumable(
  config: ml_collections.ConfigDict, workdir: pathlib.Path, seeds: list[int] | None = None
) -> None:
  """Raises ConfigError when `workdir` holds a run whose shapes `config`
  changes, or a stack of other seeds than `seeds` (None: a run alone; a stack
  of seeds saved its `seeds.json`). Logs a warning naming the fields of
  `DYNAMICS_SECTIONS` that `config` changes: the rest of the run trains with
  them (a recipe's defaults may have changed since the run started)."""
  saved_seeds = load_seeds(workdir)
  if saved_seeds != seeds:
    there = 'a run alone' if saved_seeds is None else f'a stack of seeds {saved_seeds}'
    here = 'a run alone' if seeds is None else f'a stack of seeds {seeds}'
    resume = (
      'without --seeds'
      if saved_seeds is None
      else f'with --seeds={len(saved_seeds)} and config.seed={saved_seeds[0]}'
    )
    raise ConfigError(
      f'{workdir} holds {there}, not {here}: resume it {resume}, or use a new --workdir'
    )
  saved_config = load_config(workdir)
  saved = json.loads(saved_config.to_json_best_effort())
  now = json.loads(config.to_json_best_effort())
  for field in SHAPE_FIELDS:
    old, new = saved, now
    for part in field.split('.'):
      old, new = old[part], new[part]
    if old != new:
      raise ConfigError(
        f'{workdir} holds a run with a different {field} ({old} there, {new} '
        'now): its checkpoints cannot be resumed with this config. Use a new '
        '--workdir, or the same config to resume.'
      )
  old_fields, new_fields = flat_fields(saved_config), flat_fields(config)
  changed = [
    f'{name} {old_fields.get(name)!r} -> {value!r}'
    for name, value in new_fields.items()
    if name.split('.')[0] in DYNAMICS_SECTIONS and old_fields.get(name) != value
  ]
  if changed:
    log.warning(
      'Resuming %s with changed training fields: %s. The rest of the run trains '
      'with the new values; to keep the old, set them on the command line',
      workdir,
      '; '.join(changed),
    )


def save_seeds(workdir: pathlib.Path, seeds: list[int]) -> None:
  """Writes WORKDIR/seeds.json, which marks the work directory of a stack."""
  if is_main_process():
    write_text_atomically(workdir / SEEDS_FILE, json.dumps({'seeds': seeds}))
