"""MNIST from LeCun's original idx .gz files (`DATA/mnist/`)."""

from __future__ import annotations

import gzip
import os

import numpy as np

from lm_zoo.data.corpora import resolve_data_dir
from lm_zoo.errors import DataError

FILES = {
  'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
  'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


def _read_idx(path, magic: int, item_shape: tuple[int, ...]) -> np.ndarray:
  if not path.is_file():
    raise DataError(
      f'missing MNIST file {path}: the mnist folder must hold the four '
      'idx .gz files (see ../shared/data/README.md)'
    )
  try:
    raw = gzip.decompress(path.read_bytes())
  except (OSError, EOFError) as err:
    raise DataError(f'{path} is not a complete gzip file ({err})') from None
  header = np.frombuffer(raw[:4], '>u4')[0] if len(raw) >= 4 else None
  if header != magic:
    raise DataError(f'{path} is not an idx file of this kind (magic {header}, expected {magic})')
  ndim = magic & 0xFF
  dims = tuple(int(d) for d in np.frombuffer(raw[4 : 4 + 4 * ndim], '>u4'))
  if dims[1:] != item_shape or len(raw) != 4 + 4 * ndim + int(np.prod(dims)):
    raise DataError(
      f'{path} has dimensions {dims} and {len(raw):,} bytes, '
      f'which do not fit items of shape {item_shape}'
    )
  return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_mnist(
  data_dir: str | os.PathLike | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{'train': (images, labels), 'test': ...}: images (n, 784) float32 in
  [0, 1], labels (n,) int32. `data_dir` holds `mnist/` (`chosen_data_dir`)."""
  folder = resolve_data_dir(data_dir) / 'mnist'
  out = {}
  for split, (images_file, labels_file) in FILES.items():
    images = _read_idx(folder / images_file, _IMAGES_MAGIC, (28, 28))
    labels = _read_idx(folder / labels_file, _LABELS_MAGIC, ())
    if len(images) != len(labels):
      raise DataError(f'MNIST {split}: {len(images)} images but {len(labels)} labels')
    out[split] = (
      images.reshape(len(images), -1).astype(np.float32) / 255.0,
      labels.astype(np.int32),
    )
  return out
