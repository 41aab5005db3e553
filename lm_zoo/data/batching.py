"""Batching a token stream into parallel rows and BPTT windows.

A stream of N tokens has N - 1 (input, target) pairs. They are laid out as
`batch_size` contiguous rows of ceil((N - 1) / batch_size) pairs; the slots
past the last pair (fewer than batch_size, at the end of the last rows) are
padding with weight 0, so every pair is scored exactly once at any batch size
(evaluation at batch size 20 and 1 sees the same tokens). Each row is a
continuous piece of text, so the recurrent state of row b carries from one
window to the next.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from lm_zoo.errors import DataError


@dataclasses.dataclass(frozen=True)
class Window:
  """One BPTT window: `inputs`, `targets` int32 and `weights` float32, all (B, T).

  `start` is the window's first time index within the rows, the position to
  resume from; `length` its time steps of the rows: T, or fewer where the
  window was padded (`BatchedStream.windows(pad_last=True)`).
  """

  inputs: np.ndarray
  targets: np.ndarray
  weights: np.ndarray
  start: int
  length: int


def variable_bptt_lengths(
  num_steps: int,
  bptt: int,
  seed: int,
  min_len: int = 5,
  max_len: int | None = None,
  half_prob: float = 0.05,
  stddev: float = 5.0,
) -> list[int]:
  """AWD-LSTM's variable window lengths covering `num_steps` time steps.

  base = bptt with probability 1 - half_prob, else bptt / 2;
  length = max(min_len, int(N(base, stddev))), truncated toward zero with no
  upper limit, as awd-lstm-lm's and alstm's `main.py` draw it (`max_len`
  caps it where memory must be bounded); the last window is cut to what is
  left. The lengths are a function of `seed`, so an epoch can be replayed
  exactly.
  """
  if not 1 <= min_len <= (max_len or min_len):
    raise DataError(f'variable BPTT needs 1 <= min_len <= max_len, got {min_len}, {max_len}')
  rng = np.random.default_rng(seed)
  lengths, total = [], 0
  while total < num_steps:
    base = bptt if rng.random() < 1 - half_prob else bptt / 2
    length = max(min_len, int(rng.normal(base, stddev)))
    if max_len is not None:
      length = min(length, max_len)
    length = min(length, num_steps - total)
    lengths.append(length)
    total += length
  return lengths


class BatchedStream:
  """A token stream laid out as `batch_size` rows of (input, target) pairs."""

  def __init__(self, stream: np.ndarray, batch_size: int):
    stream = np.asarray(stream)
    if stream.ndim != 1:
      raise DataError(f'a token stream must be 1-D, got shape {stream.shape}')
    if batch_size < 1:
      raise DataError(f'batch_size must be at least 1, got {batch_size}')
    num_pairs = len(stream) - 1
    if num_pairs < batch_size:
      raise DataError(f'a stream of {len(stream)} tokens is too short for batch size {batch_size}')
    self.batch_size = batch_size
    self.num_pairs = num_pairs
    self.row_length = -(-num_pairs // batch_size)
    padded = batch_size * self.row_length
    flat_in = np.zeros(padded, np.int32)
    flat_tg = np.zeros(padded, np.int32)
    flat_w = np.zeros(padded, np.float32)
    flat_in[:num_pairs] = stream[:-1]
    flat_tg[:num_pairs] = stream[1:]
    flat_w[:num_pairs] = 1.0
    shape = (batch_size, self.row_length)
    self.inputs = flat_in.reshape(shape)
    self.targets = flat_tg.reshape(shape)
    self.weights = flat_w.reshape(shape)

  def window_lengths(self, bptt: int, variable: bool = False, seed: int = 0) -> list[int]:
    """The lengths of the windows that cover the rows once (one epoch)."""
    if bptt < 1:
      raise DataError(f'bptt must be at least 1, got {bptt}')
    if variable:
      return variable_bptt_lengths(self.row_length, bptt, seed)
    full, rest = divmod(self.row_length, bptt)
    return [bptt] * full + ([rest] if rest else [])

  def windows(
    self,
    bptt: int,
    start: int = 0,
    variable: bool = False,
    seed: int = 0,
    pad_last: bool = False,
    multiple: int = 1,
  ) -> Iterator[Window]:
    """Iterates the windows of one pass, beginning at time index `start`.

    `start` must be a window boundary of the same (bptt, variable, seed), such
    as a `Window.start` or the end of the last window seen. With `pad_last`,
    a last window shorter than `bptt` comes padded to it with steps of weight
    0, so that a pass of fixed windows has one shape (a jitted step compiles
    once); with `multiple`, every window comes padded so to a multiple of
    that many steps (variable windows: a few shapes, not one per length).
    A padded window's scores are those of its own steps; the recurrent
    state after it is that after them where the model is told its own steps
    (`RecurrentLM(steps=...)`; the train step's `hold_padding`, on for
    variable windows), else that after the padding.
    """
    if multiple < 1:
      raise DataError(f'windows are padded to a multiple of at least 1 step, got {multiple}')
    position = 0
    for length in self.window_lengths(bptt, variable, seed):
      if position >= start:
        end = position + length
        arrays = (
          self.inputs[:, position:end],
          self.targets[:, position:end],
          self.weights[:, position:end],
        )
        padded = bptt if pad_last and end == self.row_length and length < bptt else length
        padded = -(-padded // multiple) * multiple
        if padded > length:
          arrays = tuple(np.pad(a, ((0, 0), (0, padded - length))) for a in arrays)
        yield Window(*arrays, start=position, length=length)
      elif position + length > start:
        raise DataError(f'resume position {start} is not a window boundary')
      position += length

  def num_windows(self, bptt: int, variable: bool = False, seed: int = 0) -> int:
    return len(self.window_lengths(bptt, variable, seed))
