"""A training run's work directory: the lock that keeps it to one process,
its config, whether a config may resume it, and its best weights as the
start of another run."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import pathlib
import socket
from typing import Any, Iterator

import jax
import ml_collections

from lm_zoo.data import Corpus, Vocab
from lm_zoo.data.corpora import SPLITS, vocab_sha256
from lm_zoo import __version__
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError, WorkdirInUse
from lm_zoo.training.checkpoints import FORMAT_VERSION, Checkpoints, write_text_atomically
from lm_zoo.training.metrics import flat_fields
from lm_zoo.training.parallel import is_main_process, sync_processes

log = logging.getLogger(__name__)

CONFIG_FILE = 'config.json'
# The fingerprint of the data a run trained on (`record_data`).
DATA_FILE = 'data.json'
# Its vocabulary, id order (`load_vocab`).
VOCAB_FILE = 'vocab.json'
LOCK_FILE = 'lock'
# The seeds of a stack trained at once (lm_zoo.training.stacked); absent for a run alone.
SEEDS_FILE = 'seeds.json'

# Fields that fix the shapes of a checkpoint: a run cannot resume across them.
SHAPE_FIELDS = ('model.cell', 'model.num_layers', 'model.embed_size', 'model.embed_ratio',
                'model.hidden_size', 'model.output_size', 'model.param_budget',
                'model.tie_embeddings',
                'model.recurrent_bias',
                'model.mogrifier', 'model.alstm', 'model.dual.size', 'model.mos.components',
                'data.name', 'data.batch_size', 'optimizer.name',
                'averaging.trigger')
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
    raise ConfigError('the work directory is empty: name a folder for the run '
                      '(--workdir=runs/NAME)')
  workdir = pathlib.Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f'--workdir={workdir} is a file, not a folder: name a folder for the run')
  if workdir.is_dir():
    entries = sorted(p.name for p in workdir.iterdir())
    if entries and not {CONFIG_FILE, LOCK_FILE, 'checkpoints'} & set(entries):
      shown = ', '.join(entries[:3]) + (f' and {len(entries) - 3} more' if len(entries) > 3
                                        else '')
      raise ConfigError(f'{workdir} holds files lm_zoo did not write ({shown}): train in a new '
                        'or empty folder')
    refuse_links(workdir)
  return workdir


def refuse_links(workdir: pathlib.Path) -> None:
  """Raises ConfigError naming the first symbolic link inside `workdir`:
  lm_zoo writes nothing through a link, which could point out of the work
  directory (the folder itself may be a link)."""
  for folder, dirs, files in os.walk(workdir):
    for name in sorted(dirs + files):
      path = pathlib.Path(folder) / name
      if path.is_symlink():
        raise ConfigError(f'{path} is a symbolic link: lm_zoo writes nothing through links '
                          'inside a work directory; remove it, or use a new --workdir')


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
  with contextlib.ExitStack() as held:
    if index == 0:
      folder = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
      held.callback(os.close, folder)
      _flock(folder, wait, workdir, path)
    try:  # never through a link: the pid written into it would land elsewhere
      descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
      if err.errno == errno.ELOOP:
        raise ConfigError(f'{path} is a symbolic link: lm_zoo writes nothing through links '
                          'inside a work directory; remove it, or use a new --workdir') from None
      raise
    f = held.enter_context(os.fdopen(descriptor, 'r+'))
    _flock(f.fileno(), wait, workdir, path)
    f.seek(0)
    f.truncate()
    f.write(f'pid {os.getpid()} on host {socket.gethostname()}\n')
    f.flush()
    yield


def _flock(descriptor: int, wait: bool, workdir: pathlib.Path, path: pathlib.Path) -> None:
  """Takes an exclusive flock on `descriptor` (held until it is closed), or
  raises WorkdirInUse naming the holder from the lock file at `path`."""
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
  except BlockingIOError:
    try:
      holder = path.read_text().strip()
    except OSError:
      holder = ''
    holder = holder or 'another process (its lock file was removed)'
    raise WorkdirInUse(f'{workdir} is in use by {holder}: wait for that run to end, or train '
                       'in another --workdir') from None


# config.json's keys beside the config's sections: the work directory's format
# (`lm_zoo.training.checkpoints.FORMAT_VERSION`) and the lm_zoo that wrote it.
FORMAT_KEY, WRITER_KEY = 'format_version', 'lm_zoo_version'


def save_config(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
  """Writes WORKDIR/config.json with the format it is written in (process
  0 of many)."""
  if is_main_process():
    saved = {FORMAT_KEY: FORMAT_VERSION, WRITER_KEY: __version__,
             **json.loads(config.to_json_best_effort())}
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
    write_text_atomically(workdir / VOCAB_FILE, json.dumps(
        {'kind': corpus.vocab.kind, 'tokens': list(corpus.vocab.tokens)}))
    write_text_atomically(path, json.dumps(corpus.fingerprint(), indent=2))
  sync_processes('lm_zoo data recorded')


def read_json(path: pathlib.Path, what: str) -> Any:
  """A work directory's JSON file; a one-line ConfigError when it is missing
  or does not parse."""
  if not path.is_file():
    raise ConfigError(f'{path} is missing: {what}. Restore it, or train again in a new '
                      '--workdir')
  try:
    return json.loads(path.read_text())
  except (ValueError, UnicodeDecodeError) as err:
    raise ConfigError(f'{path} is damaged ({type(err).__name__}: {err}): restore it, or '
                      'train again in a new --workdir') from None


def load_vocab(workdir: str | pathlib.Path) -> Vocab:
  """The vocabulary a run trained with (WORKDIR/vocab.json), checked against
  the fingerprint of the run's data (WORKDIR/data.json): a renamed or
  reordered token would map ids to other words."""
  workdir = pathlib.Path(workdir)
  saved = read_json(workdir / VOCAB_FILE, 'every work directory keeps its vocabulary')
  fingerprint = read_json(workdir / DATA_FILE, 'every work directory keeps the fingerprint '
                          'of its data')
  try:
    vocab = Vocab(tuple(saved['tokens']), kind=saved['kind'])
  except (KeyError, TypeError, ValueError) as err:
    raise ConfigError(f'{workdir / VOCAB_FILE} is damaged (no valid {err}): restore it, or '
                      'train again in a new --workdir') from None
  if vocab_sha256(vocab) != fingerprint.get('vocab_sha256'):
    raise ConfigError(f'{workdir / VOCAB_FILE} is not the vocabulary the run trained with '
                      f'(its sha256 differs from {workdir / DATA_FILE}\'s): restore it, or '
                      'train again in a new --workdir')
  return vocab


def check_data(corpus: Corpus, workdir: str | pathlib.Path) -> None:
  """Raises ConfigError when `corpus` is not the data the run in `workdir`
  was trained on (its vocabulary, or a split, differs from data.json): the
  ids would map to other words, and the scores mean nothing."""
  path = pathlib.Path(workdir) / DATA_FILE
  saved = read_json(path, 'every work directory keeps the fingerprint of its data')
  now = corpus.fingerprint()
  differ = [key for key in ('vocab_sha256', *SPLITS) if saved.get(key) != now[key]]
  if differ:
    what = ('the vocabulary' if differ[0] == 'vocab_sha256' else
            f'the {differ[0]} split ({now[differ[0]]["tokens"]:,} tokens, the run\'s had '
            f'{saved[differ[0]]["tokens"]:,})')
    raise ConfigError(f'the {corpus.name} data differs from what {workdir} was trained on: '
                      f'{what} is another ({path} has the fingerprint of the run\'s '
                      'data). Point the program\'s --data_dir at the files the run used.')


def load_config(workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
  """The config a work directory was trained with.

  Raises:
    ConfigError: config.json is missing, does not parse, or was written in
      another format than this lm_zoo's (`FORMAT_VERSION`).
  """
  path = pathlib.Path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise ConfigError(f'{path} not found: is {workdir} a work directory written '
                      'by lm-zoo-train?')
  try:
    saved = json.loads(path.read_text())
  except ValueError as err:
    raise ConfigError(f'{path} is corrupt or truncated ({err}): restore it, or train '
                      'again in a new --workdir') from None
  if not isinstance(saved, dict):
    raise ConfigError(f'{path} holds no config (a JSON {type(saved).__name__}): restore it, '
                      'or train again in a new --workdir')
  written, writer = saved.pop(FORMAT_KEY, None), saved.pop(WRITER_KEY, 'an earlier version')
  if written != FORMAT_VERSION:
    raise ConfigError(f'{workdir} was written by lm_zoo {writer} (format {written}); this is '
                      f'lm_zoo {__version__} (format {FORMAT_VERSION}), which reads only its '
                      'own: use that lm_zoo for it, or train again in a new --workdir')
  config = base_config()
  unknown = _unknown_fields(saved, json.loads(config.to_json_best_effort()))
  if unknown:
    raise ConfigError(f'{path} has fields this lm_zoo does not know: {", ".join(unknown[:5])}'
                      + (f' and {len(unknown) - 5} more' if len(unknown) > 5 else '')
                      + ': it was edited or written by another version; restore it, or train '
                      'again in a new --workdir')
  config.update(saved)
  return config


def _unknown_fields(saved: Any, known: Any, prefix: str = '') -> list[str]:
  """The dotted names in `saved` that `known` (a config as JSON) lacks."""
  if not isinstance(saved, dict) or not isinstance(known, dict):
    return []
  unknown = []
  for name, value in saved.items():
    if name not in known:
      unknown.append(prefix + name)
    else:
      unknown += _unknown_fields(value, known[name], f'{prefix}{name}.')
  return unknown


def check_resumable(config: ml_collections.ConfigDict, workdir: pathlib.Path,
                    seeds: list[int] | None = None) -> None:
  """Raises ConfigError when `workdir` holds a run whose shapes `config`
  changes, or a stack of other seeds than `seeds` (None: a run alone; a stack
  of seeds saved its `seeds.json`). Logs a warning naming the fields of
  `DYNAMICS_SECTIONS` that `config` changes: the rest of the run trains with
  them (a recipe's defaults may have changed since the run started)."""
  saved_seeds = load_seeds(workdir)
  if saved_seeds != seeds:
    there = 'a run alone' if saved_seeds is None else f'a stack of seeds {saved_seeds}'
    here = 'a run alone' if seeds is None else f'a stack of seeds {seeds}'
    resume = ('without --seeds' if saved_seeds is None else
              f'with --seeds={len(saved_seeds)} and config.seed={saved_seeds[0]}')
    raise ConfigError(f'{workdir} holds {there}, not {here}: resume it {resume}, or use a '
                      'new --workdir')
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
          '--workdir, or the same config to resume.')
  old_fields, new_fields = flat_fields(saved_config), flat_fields(config)
  changed = [f'{name} {old_fields.get(name)!r} -> {value!r}'
             for name, value in new_fields.items()
             if name.split('.')[0] in DYNAMICS_SECTIONS and old_fields.get(name) != value]
  if changed:
    log.warning('Resuming %s with changed training fields: %s. The rest of the run trains '
                'with the new values; to keep the old, set them on the command line',
                workdir, '; '.join(changed))


def save_seeds(workdir: pathlib.Path, seeds: list[int]) -> None:
  """Writes WORKDIR/seeds.json, which marks the work directory of a stack."""
  if is_main_process():
    write_text_atomically(workdir / SEEDS_FILE, json.dumps({'seeds': seeds}))


def load_seeds(workdir: str | pathlib.Path) -> list[int] | None:
  """The seeds of the stack in `workdir`; None for a run alone."""
  path = pathlib.Path(workdir) / SEEDS_FILE
  return json.loads(path.read_text())['seeds'] if path.is_file() else None


def initial_params(workdir: str | pathlib.Path, like: Any) -> Any:
  """The best weights of the run in `workdir`, shaped as `like` (a fine-tuning
  stage starts from them)."""
  if not (pathlib.Path(workdir) / CONFIG_FILE).is_file():
    raise ConfigError(f'train.init_from={workdir} is not a work directory of lm-zoo-train')
  with Checkpoints(workdir) as checkpoints:  # closed
    best = checkpoints.restore_best(like)
  if best is None:
    raise ConfigError(f'train.init_from={workdir} has no best checkpoint: its run has '
                      'not finished an epoch')
  return best[0]
