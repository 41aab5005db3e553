"""MNIST loading against the dataset's published statistics."""

import gzip

import numpy as np
import pytest

from lm_zoo.data import load_mnist
from lm_zoo.errors import DataError

# Per-digit counts of LeCun's MNIST (train 60,000; test 10,000).
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_splits_match_published_statistics(data_dir):
  data = load_mnist(data_dir)
  (x, y), (xt, yt) = data['train'], data['test']
  assert x.shape == (60_000, 784) and xt.shape == (10_000, 784)
  assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() == 1.0
  np.testing.assert_array_equal(np.bincount(y), TRAIN_COUNTS)
  np.testing.assert_array_equal(np.bincount(yt), TEST_COUNTS)
  assert abs(x.mean() - 0.1307) < 1e-3  # the mean pixel everyone normalises with


def test_bad_files_are_named(tmp_path):
  (tmp_path / 'mnist').mkdir()
  with pytest.raises(DataError, match='missing MNIST file'):
    load_mnist(tmp_path)
  for name in ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'):
    (tmp_path / 'mnist' / name).write_bytes(gzip.compress(b'\x00\x00\x08\x01' + bytes(8)))
  with pytest.raises(DataError, match='not an idx file of this kind'):
    load_mnist(tmp_path)
  (tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz').write_bytes(b'not gzip')
  with pytest.raises(DataError, match='not a complete gzip file'):
    load_mnist(tmp_path)
