"""Presets: the folder a trained model travels in (`lm_zoo.runs.export`),
read back without its work directory or data (`load_params`).

A preset holds the run's config.json, vocab.json and data.json as the work
directory has them, preset.json (the preset's format and where it came
from), the best weights as model.safetensors (or shards
model-0000K-of-0000N.safetensors with model.safetensors.index.json mapping
each array to its file, as Hugging Face folders do), each array under its
'/'-joined parameter path, a README.md model card, and SHA256SUMS, the
sha256 of every other file in `sha256sum`'s format, checked whenever the
preset is loaded.

  export('runs/small', 'presets/small', max_shard_size='2GB')
  lm_zoo.load('presets/small')
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import jax
import numpy as np

from lm_zoo.data.download import sha256_file
from lm_zoo.errors import ConfigError
from lm_zoo.version import check_format

# The layout of a preset folder: a version that reads another refuses it.
PRESET_FORMAT_VERSION = 4
PRESET_FILE = 'preset.json'
WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
SUMS_FILE = 'SHA256SUMS'
CARD_FILE = 'README.md'
_UNITS = {
  '': 1,
  'B': 1,
  'KB': 10**3,
  'MB': 10**6,
  'GB': 10**9,
  'TB': 10**12,
  'KIB': 2**10,
  'MIB': 2**20,
  'GIB': 2**30,
  'TIB': 2**40,
}


def parse_size(size: str | int) -> int:
  """Bytes in `size`: an int, or a number with a unit ('2GB', '500MB',
  '1.5GiB', '300KB'; decimal units are powers of 1000)."""
  if isinstance(size, int) and not isinstance(size, bool):
    number, unit = size, ''
  else:
    match = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*', str(size))
    if not match or match.group(2).upper() not in _UNITS:
      raise ConfigError(
        f'max_shard_size={size!r} is no size: give bytes with a unit, for '
        "example '2GB', '500MB' or '1GiB'"
      )
    number, unit = float(match.group(1)), match.group(2).upper()
  if number * _UNITS[unit] < 1:
    raise ConfigError(f'max_shard_size={size!r} must be at least one byte')
  return int(number * _UNITS[unit])


def is_preset(folder: str | pathlib.Path) -> bool:
  """Whether `folder` is a preset (it has preset.json), not a work directory."""
  return (pathlib.Path(folder) / PRESET_FILE).is_file()


def _path_key(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


def flat_params(params: Any) -> dict[str, np.ndarray]:
  """The arrays of `params` by their '/'-joined paths, as NumPy arrays."""
  return {
    _path_key(path): np.ascontiguousarray(jax.device_get(leaf))
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
  }


def split_shards(arrays: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
  """`arrays` in order, packed into shards of at most `max_bytes` each (an
  array larger than that alone in its shard)."""
  shards, size = [{}], 0
  for name, array in arrays.items():
    if shards[-1] and size + array.nbytes > max_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  return shards


def write_sums(folder: pathlib.Path) -> None:
  """Writes FOLDER/SHA256SUMS: every other file's sha256, `sha256sum`'s format."""
  names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != SUMS_FILE)
  (folder / SUMS_FILE).write_text(''.join(f'{sha256_file(folder / n)}  {n}\n' for n in names))


def read_sums(text: str, where: str) -> dict[str, str]:
  """SHA256SUMS' text as {file name: sha256}; a file name with a folder in
  it is refused (a preset is one flat folder)."""
  sums = {}
  for line in text.splitlines():
    match = re.fullmatch(r'([0-9a-f]{64}) [ *]([^/\\]+)', line.strip())
    if not match or match.group(2) in ('.', '..'):
      raise ConfigError(
        f'{where} has a line that is not "SHA256  NAME": {line[:60]!r}; the '
        'preset is damaged, export it again'
      )
    sums[match.group(2)] = match.group(1)
  return sums


def verify(folder: pathlib.Path, skip: tuple[str, ...] = ()) -> None:
  """Raises ConfigError naming the first file of FOLDER/SHA256SUMS that is
  missing or whose sha256 differs; the files named in `skip` go unchecked."""
  path = folder / SUMS_FILE
  if not path.is_file():
    raise ConfigError(f"{path} is missing: a preset lists its files' sha256 there; export it again")
  for name, digest in read_sums(path.read_text(), str(path)).items():
    if name in skip:
      continue
    if not (folder / name).is_file():
      raise ConfigError(
        f'{folder / name} is missing (SHA256SUMS lists it): export the preset again'
      )
    if sha256_file(folder / name) != digest:
      raise ConfigError(
        f"{folder / name} is damaged: its sha256 differs from SHA256SUMS'; "
        'export or download the preset again'
      )


def load_params(folder: str | pathlib.Path, like: Any) -> Any:
  """The preset's weights shaped as `like` (a tree of arrays or shapes).

  Every file the model is read from is checked against SHA256SUMS first (a
  changed byte in a shard would load as other weights); the model card,
  which a publisher may edit, is not.

  Raises:
    ConfigError: the preset is of another format, a file of it differs
      from SHA256SUMS, or its weights lack an array of `like` or hold one of
      another shape or dtype.
  """
  from safetensors.numpy import load_file

  folder = pathlib.Path(folder)
  _check_preset_format(folder)
  verify(folder, skip=(CARD_FILE,))
  if (folder / INDEX_FILE).is_file():
    weight_map = json.loads((folder / INDEX_FILE).read_text())['weight_map']
    files = sorted(set(weight_map.values()))
  else:
    files = [WEIGHTS_FILE]
  arrays = {}
  for name in files:
    if not (folder / name).is_file():
      raise ConfigError(f'{folder / name} is missing: export the preset again')
    arrays.update(load_file(str(folder / name)))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
  out = []
  for path, leaf in leaves:
    key = _path_key(path)
    array = arrays.pop(key, None)
    if array is None or array.shape != tuple(leaf.shape) or array.dtype != leaf.dtype:
      what = 'lacks' if array is None else f'has another shape or dtype ({array.shape}) for'
      raise ConfigError(
        f'the weights in {folder} {what} {key}: the preset does not fit its '
        'config.json; export it again'
      )
    out.append(array)
  if arrays:
    raise ConfigError(
      f'the weights in {folder} hold {sorted(arrays)[0]}, which its model '
      'lacks: the preset does not fit its config.json; export it again'
    )
  return jax.tree_util.tree_unflatten(treedef, out)


def _check_preset_format(folder: pathlib.Path) -> None:
  """Raises ConfigError when FOLDER/preset.json is of another format."""
  try:
    record = json.loads((folder / PRESET_FILE).read_text())
  except (OSError, ValueError) as err:
    raise ConfigError(
      f'{folder / PRESET_FILE} cannot be read ({type(err).__name__}): export the preset again'
    ) from None
  fix = 'use that lm_zoo, or export it again with this one'
  check_format(record, PRESET_FORMAT_VERSION, f'the preset {folder}', fix)
