"""Checkpoints with orbax: the latest train state, and the best parameters.

Orbax writes each checkpoint into a temporary folder and renames it when it is
complete, so a kill at any moment leaves the previous checkpoint loadable; a
step saved again keeps its previous checkpoint until the new one is
complete, and what a kill leaves half done is finished or removed when the
folder is opened again. The
work directory's other files are replaced whole too (`write_text_atomically`).
A checkpoint that cannot be read (a file corrupted or cut short after it was
written) is a `CheckpointError` naming its folder and what failed; each
checkpoint also keeps a sha256 digest of every array, checked on restore, so
damage that still decodes is found too. Each checkpoint records the
format it was written in (`FORMAT_VERSION`, with lm_zoo's version), and one
of another format is refused in one line saying which lm_zoo wrote it.

In a multi-process run every process saves and restores (orbax writes each
its own shards, and its metadata from process 0); the folders this module
moves and removes itself are moved by process 0, the others waiting.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from lm_zoo.errors import CheckpointError, ConfigError
from lm_zoo.runs.files import is_main_process, sync_processes
from lm_zoo.version import FORMAT_KEY, WRITER_KEY, __version__, check_format

log = logging.getLogger(__name__)

# The layout of what lm_zoo writes into a work directory (its checkpoints,
# config.json): a version that reads another format refuses it.
FORMAT_VERSION = 5
# The key of a checkpoint's meta that holds its arrays' digests (beside its
# format and the lm_zoo that wrote it: FORMAT_KEY, WRITER_KEY).
_DIGESTS = 'array_digests'
# A step's previous checkpoint while the same step is saved again; orbax's own
# folders in the making end in ORBAX_TMP.
_PREVIOUS = '.previous'
ORBAX_TMP = '.orbax-checkpoint-tmp'


def _recover(directory: pathlib.Path) -> None:
  """Finishes what a kill interrupted in `directory`: a step saved again
  whose new checkpoint never completed gets its previous one back (a
  completed one makes the previous one go), and orbax's unfinished folders
  are removed. Process 0 does it while the others wait."""
  if directory.is_dir() and is_main_process():
    _recover_folders(directory)
  sync_processes('lm_zoo checkpoints recovered')


def _recover_folders(directory: pathlib.Path) -> None:
  for previous in directory.glob(f'*{_PREVIOUS}'):
    step = previous.with_name(previous.name[: -len(_PREVIOUS)])
    if step.exists():
      shutil.rmtree(previous)
    else:
      os.replace(previous, step)
  for unfinished in directory.glob(f'*{ORBAX_TMP}*'):
    shutil.rmtree(unfinished, ignore_errors=True)


def _manager(directory: pathlib.Path, max_to_keep: int) -> ocp.CheckpointManager:
  _recover(directory)
  return ocp.CheckpointManager(
    directory.absolute(),
    options=ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
    ),
    item_handlers={'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()},
  )


class Checkpoints:
  """`workdir/checkpoints` (latest train states) and `workdir/best` (params).

  `meta` is a JSON-able dict that travels with each state: the data position,
  the epoch, the validation history.
  """

  def __init__(self, workdir: str | pathlib.Path, max_to_keep: int = 2):
    workdir = pathlib.Path(workdir)
    self._latest = _manager(workdir / 'checkpoints', max_to_keep)
    self._best = _manager(workdir / 'best', 1)

  @staticmethod
  def _save(manager, step: int, tree: Any, meta: dict) -> None:
    """Saves `step`. A step saved again (the epoch's end after a periodic
    save of its last update, a SIGTERM there) keeps its previous checkpoint
    aside until the new one is complete: a kill at any point leaves one of
    the two whole (`_recover`)."""
    previous = None
    if step in manager.all_steps():
      folder = pathlib.Path(manager.directory) / str(step)
      previous = folder.with_name(folder.name + _PREVIOUS)
      if is_main_process():
        os.replace(folder, previous)
      sync_processes('lm_zoo checkpoint set aside')
      manager.reload()
    meta = {**meta, _DIGESTS: _digests(tree), FORMAT_KEY: FORMAT_VERSION, WRITER_KEY: __version__}
    manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
      force=True,
    )
    manager.wait_until_finished()
    if previous is not None and is_main_process():
      shutil.rmtree(previous)

  def _restore(self, manager, like: Any, step: int | None = None):
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    folder = pathlib.Path(manager.directory) / str(step)
    keeps_older = manager is self._latest
    _check_whole(folder, keeps_older)
    with _readable(folder, keeps_older):
      metadata = manager.item_metadata(step)['state']
    saved = {
      _keys(path): tuple(leaf.shape)
      for path, leaf in jax.tree_util.tree_flatten_with_path(metadata)[0]
    }
    wanted = {
      _keys(path): tuple(leaf.shape)
      for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]
    }
    differ = {
      keys: (saved.get(keys), shape) for keys, shape in wanted.items() if saved.get(keys) != shape
    }
    if differ or set(saved) != set(wanted):
      lines = [
        f'  {"/".join(keys)}: {"not saved" if old is None else f"saved {old}"}, this model {new}'
        for keys, (old, new) in sorted(differ.items())
      ]
      lines += [
        f'  {"/".join(keys)}: saved, not in this model' for keys in sorted(set(saved) - set(wanted))
      ]
      raise ConfigError(
        f'the checkpoint {manager.directory}/{step} does not fit this model:\n'
        + '\n'.join(lines[:20])
        + '\nWas it written with another config? Resume or '
        'evaluate it with its own config, or use a new --workdir.'
      )
    with _readable(folder, keeps_older):
      restored = manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        ),
      )
    meta = _verified(folder, restored.state, restored.meta, keeps_older)
    return restored.state, meta

  def save_latest(self, step: int, state: Any, meta: dict) -> None:
    self._save(self._latest, step, state, meta)

  def save_best(self, step: int, params: Any, meta: dict) -> None:
    self._save(self._best, step, params, meta)

  def has_latest(self) -> bool:
    return self._latest.latest_step() is not None

  def restore_latest(self, like: Any):
    """(state, meta) of the newest intact checkpoint shaped like `like`, or
    None when there is none. A damaged one is skipped with a warning naming
    it and the damage (kept on disk; the run writes over it when it comes
    back to that step); a checkpoint of another model is an error, as is
    damage to every checkpoint (the newest one's)."""
    steps = sorted(self._latest.all_steps(), reverse=True)
    first_damage = None
    for step in steps:
      try:
        restored = self._restore(self._latest, like, step)
      except CheckpointError as err:
        log.warning('Skipping a damaged checkpoint: %s', err)
        first_damage = first_damage or err
        continue
      if first_damage is not None:
        log.warning(
          'Resuming from %s/%d, the newest intact checkpoint', self._latest.directory, step
        )
      return restored
    if first_damage is not None:
      raise CheckpointError(
        f'no intact checkpoint to resume from in {self._latest.directory}: {first_damage}'
      )
    return None

  def restore_best(self, like: Any):
    """(params, meta) of the best checkpoint shaped like `like`, or None."""
    return self._restore(self._best, like)

  def close(self) -> None:
    self._latest.close()
    self._best.close()

  def __enter__(self) -> 'Checkpoints':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class _readable:
  """Turns an error reading the checkpoint folder `folder` into a
  `CheckpointError` naming it, and the JSON files in it that do not parse;
  `keeps_older`: whether an older checkpoint stands beside it (`_advice`)."""

  def __init__(self, folder: pathlib.Path, keeps_older: bool):
    self.folder, self.keeps_older = pathlib.Path(folder), keeps_older

  def __enter__(self):
    return self

  def __exit__(self, kind, err, tb):
    if err is None or isinstance(err, ConfigError):
      return False
    # Orbax wraps TensorStore's error, which names the array and the file.
    cause = err
    while cause.__cause__ is not None:
      cause = cause.__cause__
    cause = str(cause).strip().splitlines()[0].split(' [tensorstore_spec=')[0][:400]
    broken = [
      str(path)
      for path in sorted(self.folder.rglob('*'))
      if path.is_file() and _is_broken_json(path)
    ]
    raise CheckpointError(
      f'the checkpoint {self.folder} is corrupt or truncated: '
      + (f'unreadable JSON in {", ".join(broken)}' if broken else cause)
      + f'; {_advice(self.folder, self.keeps_older)}.'
    ) from err


def _digests(tree: Any) -> dict[str, str]:
  """sha256 of each array's dtype, shape and bytes, by its '/'-joined path:
  orbax keeps no checksum of the data, so a flipped bit would restore. An
  array spread over several processes is digested whole on each: its copy
  when replicated, else gathered from all of them (every process calls this
  on the same tree)."""
  digests = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      leaf = (
        leaf.addressable_data(0)
        if leaf.is_fully_replicated
        else multihost_utils.process_allgather(leaf, tiled=True)
      )
    array = np.ascontiguousarray(jax.device_get(leaf))
    digest = hashlib.sha256(f'{array.dtype.str}{array.shape}'.encode())
    digest.update(array.tobytes())
    digests['/'.join(_keys(path))] = digest.hexdigest()
  return digests


def _advice(folder: pathlib.Path, keeps_older: bool) -> str:
  return (
    f'delete {folder}, or train again in a new --workdir'
    if keeps_older
    else f'{folder.parent.name}/ keeps no other copy: train again in a new --workdir, or '
    'put a backup of the folder back'
  )


def _check_whole(folder: pathlib.Path, keeps_older: bool) -> None:
  """A CheckpointError naming the file when a file every checkpoint has is
  missing from `folder` (orbax would report a missing metadata file as a
  tree that does not fit)."""
  for part in ('state/_METADATA', 'meta/metadata'):
    if not (folder / part).is_file():
      raise CheckpointError(
        f'the checkpoint {folder} is damaged: {folder / part} is missing; '
        f'{_advice(folder, keeps_older)}.'
      )


def _verified(folder: pathlib.Path, tree: Any, meta: dict, keeps_older: bool) -> dict:
  """`meta` without its digests and format once the checkpoint is of this
  format and every array of `tree` matches its digest; else a
  CheckpointError naming the checkpoint and what is wrong."""
  fix = 'use that lm_zoo to read it, or train again in a new --workdir.'
  meta = check_format(meta, FORMAT_VERSION, f'the checkpoint {folder}', fix, CheckpointError)
  expected = meta.pop(_DIGESTS, None)
  if not isinstance(expected, dict):
    raise CheckpointError(
      f'the checkpoint {folder} is damaged: its meta has no array digests '
      f'to check the arrays against; {_advice(folder, keeps_older)}.'
    )
  got = _digests(tree)
  damaged = sorted(name for name in set(expected) | set(got) if got.get(name) != expected.get(name))
  if damaged:
    raise CheckpointError(
      f'the checkpoint {folder} is damaged: {damaged[0]}'
      + (f' and {len(damaged) - 1} more arrays' if len(damaged) > 1 else '')
      + f' differ from the digests saved with them; '
      f'{_advice(folder, keeps_older)}.'
    )
  return meta


def _is_broken_json(path: pathlib.Path) -> bool:
  """Whether `path` is one of orbax's JSON files (metadata, not array data)
  and does not parse."""
  if path.parent.name == 'd' or path.suffix in ('.ocdbt', '.txt'):
    return False  # array chunks, OCDBT manifests, commit markers
  try:
    json.loads(path.read_bytes())
    return False
  except (ValueError, OSError):
    return True


def _keys(path) -> tuple[str, ...]:
  """A tree path as strings: dict keys, attribute names and sequence indices."""
  return tuple(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


def save_tree(directory: str | pathlib.Path, tree: Any, meta: dict) -> None:
  """Writes one pytree of arrays with a JSON-able `meta` dict to `directory`
  (replacing what was there, atomically): for example a meta-learner."""
  manager = _manager(pathlib.Path(directory), 1)
  Checkpoints._save(manager, 0, tree, meta)
  manager.close()


def restore_tree(directory: str | pathlib.Path) -> tuple[Any, dict] | None:
  """(tree, meta) written by `save_tree`, with the tree's saved structure, or
  None when `directory` holds none."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return None
  manager = _manager(directory, 1)
  step = manager.latest_step()
  folder = directory / str(step)
  if step is not None:
    _check_whole(folder, keeps_older=False)
  with _readable(folder, keeps_older=False):
    restored = (
      None
      if step is None
      else manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
      )
    )
  manager.close()
  if restored is None:
    return None
  return restored.state, _verified(folder, restored.state, restored.meta, keeps_older=False)
