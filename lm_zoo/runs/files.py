"""The files of a work directory: their names, and how lm_zoo writes and
reads them (`write_text_atomically`, `read_json`), on one process or, with
data parallelism over many hosts, from process 0 (`is_main_process`) while
the others wait (`sync_processes`)."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any

import jax
from jax.experimental import multihost_utils

from lm_zoo.errors import ConfigError

CONFIG_FILE = 'config.json'
# The fingerprint of the data a run trained on (`record_data`).
DATA_FILE = 'data.json'
# Its vocabulary, id order (`load_vocab`).
VOCAB_FILE = 'vocab.json'
LOCK_FILE = 'lock'
# The seeds of a stack trained at once; absent for a run alone.
SEEDS_FILE = 'seeds.json'
# Every command line that trained in the work directory, a line each (`record_command`).
COMMANDS_FILE = 'commands.txt'
# The finished run's figures (`lm_zoo.training.summary`).
SUMMARY_FILE = 'summary.json'
# lm-zoo-eval's results, a file per evaluator (`{evaluator}.json`).
EVALUATIONS_DIR = 'evaluations'


def is_main_process() -> bool:
  """Whether this process writes the work directory's files (process 0 of
  many, or the only one)."""
  return jax.process_index() == 0


def sync_processes(name: str) -> None:
  """Waits until every process has reached the point `name` (at once on one
  process): what process 0 wrote before it is then there for all."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def write_text_atomically(path: str | pathlib.Path, text: str) -> None:
  """Replaces `path` by `text` in one rename: a kill at any moment leaves the
  old file or the new one, never a part."""
  path = pathlib.Path(path)
  with tempfile.NamedTemporaryFile(
    'w', dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp', delete=False
  ) as out:
    try:
      out.write(text)
      out.flush()
      os.fsync(out.fileno())
      os.chmod(out.name, 0o644)  # temporary files are private; ours are not
      os.replace(out.name, path)
    except BaseException:  # a full disk, a signal: nothing half written stays behind
      os.unlink(out.name)
      raise


def read_json(
  path: pathlib.Path, what: str, fix: str = 'restore it, or train again in a new --workdir'
) -> Any:
  """A work directory's JSON file; a one-line ConfigError when it is missing
  or does not parse, ending with `fix`."""
  if not path.is_file():
    raise ConfigError(f'{path} is missing: {what}. {fix[0].upper()}{fix[1:]}')
  try:
    return json.loads(path.read_text())
  except (ValueError, UnicodeDecodeError) as err:
    raise ConfigError(f'{path} is damaged ({type(err).__name__}: {err}): {fix}') from None
