"""A training run's work directory: the lock that keeps it to one process,
its config, whether a config may resume it, and its best weights as the
start of another run."""

from __future__ import annotations

import contextlib
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
from lm_zoo.data.corpora import SPLITS
from lm_zoo.configs import base_config, upgrade_config
from lm_zoo.errors import ConfigError, WorkdirInUse
from lm_zoo.models import legacy_transposed
from lm_zoo.training.checkpoints import Checkpoints, write_text_atomically
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
                'model.hidden_size', 'model.output_size', 'model.param_budget', 'model.tie_embeddings',
                'model.recurrent_bias',
                'model.mogrifier', 'model.alstm', 'model.dual.size', 'model.mos.components',
                'data.name', 'data.batch_size', 'optimizer.name',
                'averaging.trigger')
# Sections whose other fields change how the rest of a resumed run trains:
# allowed, and logged as a warning.
DYNAMICS_SECTIONS = ('model', 'optimizer', 'schedule')


@contextlib.contextmanager
def workdir_lock(workdir: pathlib.Path, wait: bool = False) -> Iterator[None]:
  """Holds `workdir`'s lock (an flock on WORKDIR/lock, which names the holder's
  host and pid) for the duration: two runs training in one work directory
  would overwrite each other's checkpoints and metrics. The kernel releases
  the lock when its process ends, however it ends, so a killed run leaves
  nothing to clean up. (flock is per host: on a network file system mounted
  by several hosts it may not exclude them.) The processes of one
  multi-process run share the work directory: process 0 takes WORKDIR/lock,
  process N WORKDIR/lock.N.

  Args:
    wait: block until the lock is free instead of raising.

  Raises:
    WorkdirInUse: another process holds it (and `wait` is False).
  """
  workdir.mkdir(parents=True, exist_ok=True)
  index = jax.process_index()
  with open(workdir / (f'{LOCK_FILE}.{index}' if index else LOCK_FILE), 'a+') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or 'another process'
      raise WorkdirInUse(f'{workdir} is in use by {holder}: wait for that run to end, '
                         'or train in another --workdir') from None
    try:
      f.seek(0)
      f.truncate()
      f.write(f'pid {os.getpid()} on host {socket.gethostname()}\n')
      f.flush()
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def save_config(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
  """Writes WORKDIR/config.json (process 0 of many)."""
  if is_main_process():
    write_text_atomically(workdir / CONFIG_FILE, config.to_json_best_effort(indent=2))
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


def load_vocab(workdir: str | pathlib.Path) -> Vocab | None:
  """The vocabulary a run trained with (WORKDIR/vocab.json), or None for a
  run from before vocabularies were kept."""
  path = pathlib.Path(workdir) / VOCAB_FILE
  if not path.is_file():
    return None
  saved = json.loads(path.read_text())
  return Vocab(tuple(saved['tokens']), kind=saved['kind'])


def check_data(corpus: Corpus, workdir: str | pathlib.Path) -> None:
  """Raises ConfigError when `corpus` is not the data the run in `workdir`
  was trained on (its vocabulary, or a split, differs from data.json): the
  ids would map to other words, and the scores mean nothing. Runs from
  before data.json was written pass."""
  path = pathlib.Path(workdir) / DATA_FILE
  if not path.is_file():
    return
  saved, now = json.loads(path.read_text()), corpus.fingerprint()
  differ = [key for key in ('vocab_sha256', *SPLITS) if saved.get(key) != now[key]]
  if differ:
    what = ('the vocabulary' if differ[0] == 'vocab_sha256' else
            f'the {differ[0]} split ({now[differ[0]]["tokens"]:,} tokens, the run\'s had '
            f'{saved[differ[0]]["tokens"]:,})')
    raise ConfigError(f'the {corpus.name} data differs from what {workdir} was trained on: '
                      f'{what} is another ({path} has the fingerprint of the run\'s '
                      'data). Point LM_ZOO_DATA or --config.data_dir at the files the run '
                      'used.')


def load_config(workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
  """The config a work directory was trained with, over today's defaults
  (so work directories from before a field existed still load)."""
  path = pathlib.Path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise ConfigError(f'{path} not found: is {workdir} a work directory written '
                      'by launch/train.py?')
  try:
    saved = json.loads(path.read_text())
  except ValueError as err:
    raise ConfigError(f'{path} is corrupt or truncated ({err}): restore it, or train '
                      'again in a new --workdir') from None
  config = base_config()
  config.update(upgrade_config(saved))
  return config


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
    raise ConfigError(f'train.init_from={workdir} is not a work directory of launch/train.py')
  with Checkpoints(workdir, legacy_transposed=legacy_transposed) as checkpoints:  # closed
    best = checkpoints.restore_best(like)
  if best is None:
    raise ConfigError(f'train.init_from={workdir} has no best checkpoint: its run has '
                      'not finished an epoch')
  return best[0]
