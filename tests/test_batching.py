"""Batching loses and duplicates no token; variable BPTT stays in its bounds."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lm_zoo.data import BatchedStream, variable_bptt_lengths
from lm_zoo.errors import DataError


def _pairs_by_row(batched, windows):
  """(input, target) pairs with weight 1, row by row in time order."""
  rows = [[] for _ in range(batched.batch_size)]
  for w in windows:
    for b in range(batched.batch_size):
      keep = w.weights[b] > 0
      rows[b] += list(zip(w.inputs[b][keep], w.targets[b][keep]))
  return [p for row in rows for p in row]


@pytest.mark.parametrize(
  'n, batch_size, bptt, variable',
  [
    (1001, 7, 9, False),
    (1001, 1, 35, False),
    (64, 8, 70, False),
    (5000, 20, 35, True),
    (997, 3, 12, True),
  ],
)
def test_every_pair_exactly_once_in_order(n, batch_size, bptt, variable):
  stream = np.arange(n, dtype=np.int32) * 3 + 1
  batched = BatchedStream(stream, batch_size)
  pairs = _pairs_by_row(batched, batched.windows(bptt, variable=variable, seed=3))
  expected = list(zip(stream[:-1], stream[1:]))
  assert pairs == expected  # nothing lost, nothing repeated, rows contiguous


@pytest.mark.parametrize('variable', [False, True])
def test_a_padded_last_window_has_the_shape_of_the_others_and_scores_the_same_pairs(variable):
  stream = np.arange(1001, dtype=np.int32) * 3 + 1
  batched = BatchedStream(stream, 7)  # rows of 143 pairs: 14 windows of 10, one of 3
  plain = list(batched.windows(10, variable=variable, seed=4))
  padded = list(batched.windows(10, variable=variable, seed=4, pad_last=True))
  assert _pairs_by_row(batched, padded) == _pairs_by_row(batched, plain)
  assert [w.length for w in padded] == [w.length for w in plain]
  assert [w.start for w in padded] == [w.start for w in plain]
  for before, after in zip(plain[:-1], padded[:-1]):  # only the last one changes
    np.testing.assert_array_equal(before.inputs, after.inputs)
  last, short = padded[-1], plain[-1]
  if short.length < 10:
    assert last.inputs.shape == last.targets.shape == last.weights.shape == (7, 10)
    assert not last.weights[:, short.length :].any()
  np.testing.assert_array_equal(last.targets[:, : short.length], short.targets)
  if not variable:
    assert {w.inputs.shape for w in padded} == {(7, 10)}


def test_variable_windows_padded_to_a_multiple_take_few_shapes_and_the_same_pairs():
  stream = np.arange(5001, dtype=np.int32) * 3 + 1
  batched = BatchedStream(stream, 20)
  plain = list(batched.windows(35, variable=True, seed=4))
  padded = list(batched.windows(35, variable=True, seed=4, pad_last=True, multiple=8))
  assert _pairs_by_row(batched, padded) == _pairs_by_row(batched, plain)
  assert [(w.start, w.length) for w in padded] == [(w.start, w.length) for w in plain]
  for window in padded:
    # the next multiple of 8; the last window's of bptt where it is shorter
    shortest = 35 if window is padded[-1] else window.length
    assert window.inputs.shape[1] == max(8 * -(-window.length // 8), 8 * -(-shortest // 8))
    assert not window.weights[:, window.length :].any()
  lengths = {w.length for w in plain}
  assert len({w.inputs.shape for w in padded}) < len(lengths)
  with pytest.raises(DataError, match='a multiple of at least 1 step, got 0'):
    next(batched.windows(35, multiple=0))


def test_rows_continue_across_windows():
  stream = np.arange(200, dtype=np.int32)
  batched = BatchedStream(stream, 4)
  windows = list(batched.windows(7))
  for prev, nxt in zip(windows, windows[1:]):
    real = nxt.weights[:, 0] > 0  # the last row ends in padding
    np.testing.assert_array_equal(prev.targets[real, -1], nxt.inputs[real, 0])


def test_resume_from_a_window_start_gives_the_rest():
  batched = BatchedStream(np.arange(3000, dtype=np.int32), 5)
  full = list(batched.windows(35, variable=True, seed=(0, 2)))
  rest = list(batched.windows(35, start=full[4].start, variable=True, seed=(0, 2)))
  assert [w.start for w in rest] == [w.start for w in full[4:]]
  np.testing.assert_array_equal(rest[0].inputs, full[4].inputs)
  with pytest.raises(DataError, match='not a window boundary'):
    next(batched.windows(35, start=full[4].start + 1, variable=True, seed=(0, 2)))


def _awd_lengths(num_steps, bptt, seed):
  """awd-lstm-lm's main.py draw (alstm's is the same), on our generator:
  bptt w.p. 0.95 else bptt / 2, then max(5, int(N(base, 5))); the last window
  cut to what is left (get_batch's min with the data left)."""
  rng, lengths, i = np.random.default_rng(seed), [], 0
  while i < num_steps:
    base = bptt if rng.random() < 0.95 else bptt / 2.0
    seq_len = max(5, int(rng.normal(base, 5)))
    seq_len = min(seq_len, num_steps - i)
    lengths.append(seq_len)
    i += seq_len
  return lengths


def test_variable_lengths_are_the_authors_draw():
  bptt = 70
  lengths = variable_bptt_lengths(1_000_000, bptt, seed=0)
  assert lengths == _awd_lengths(1_000_000, bptt, seed=0)
  assert sum(lengths) == 1_000_000 and min(lengths[:-1]) >= 5
  lengths = np.array(lengths[:-1])
  # ~5% of windows are drawn around bptt / 2, the rest around bptt, truncated
  # toward zero: their mean is bptt - 1/2
  half = np.mean(lengths < (bptt * 3 / 4))
  assert 0.03 < half < 0.07
  assert abs(np.mean(lengths[lengths >= bptt * 3 / 4]) - (bptt - 0.5)) < 0.2
  assert variable_bptt_lengths(500, bptt, seed=1) == variable_bptt_lengths(500, bptt, seed=1)
  # no upper limit unless asked for one
  wide = variable_bptt_lengths(100_000, bptt, seed=2, stddev=20.0)
  assert max(wide) > bptt + 40
  assert max(variable_bptt_lengths(100_000, bptt, seed=2, stddev=20.0, max_len=80)) == 80


def test_bad_batching_arguments():
  with pytest.raises(DataError, match='too short'):
    BatchedStream(np.arange(3), 4)
  with pytest.raises(DataError, match='1-D'):
    BatchedStream(np.zeros((2, 3)), 1)
  with pytest.raises(DataError, match='bptt must be at least 1'):
    BatchedStream(np.arange(30), 2).window_lengths(0)


@settings(deadline=None, max_examples=200)
@given(
  n=st.integers(2, 400),
  batch_size=st.integers(1, 12),
  bptt=st.integers(1, 40),
  variable=st.booleans(),
  seed=st.integers(0, 3),
  data=st.data(),
)
def test_any_layout_scores_every_pair_once_and_resumes_from_any_window(
  n, batch_size, bptt, variable, seed, data
):
  """Every (input, target) pair once per epoch, in order, for any stream
  length, batch size, BPTT and variable BPTT; resuming at any window start
  gives exactly the windows that follow it."""
  assume(n - 1 >= batch_size)
  stream = np.arange(n, dtype=np.int32) * 7 + 3
  batched = BatchedStream(stream, batch_size)
  windows = list(batched.windows(bptt, variable=variable, seed=seed))
  assert _pairs_by_row(batched, windows) == list(zip(stream[:-1], stream[1:]))
  assert sum(w.length for w in windows) == batched.row_length
  assert len(windows) == batched.num_windows(bptt, variable, seed)
  k = data.draw(st.integers(0, len(windows)), label='resume at window')
  start = windows[k].start if k < len(windows) else batched.row_length
  rest = list(batched.windows(bptt, start, variable, seed))
  assert [w.start for w in rest] == [w.start for w in windows[k:]]
  for a, b in zip(rest, windows[k:]):
    np.testing.assert_array_equal(a.inputs, b.inputs)
  # what ran before the stop and what runs after it: each pair once
  assert _pairs_by_row(batched, windows[:k] + rest) == list(zip(stream[:-1], stream[1:]))
