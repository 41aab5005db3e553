"""Progress lines with an ETA, and durations as text."""

import logging

import numpy as np
import pytest

from lm_zoo.progress import ProgressLog, Throughput, eta, format_duration


@pytest.mark.parametrize(
  'seconds, text',
  [(0, '0s'), (12.4, '12s'), (59.6, '1m00s'), (245, '4m05s'), (3720, '1h02m'), (float('inf'), '?')],
)
def test_format_duration(seconds, text):
  assert format_duration(seconds) == text


def test_eta_extrapolates_the_rate_so_far():
  assert eta(10.0, 25, 100) == '30s'  # 0.4 s each, 75 left
  assert eta(10.0, 0, 100) == '?'
  assert eta(10.0, 100, 100) == '0s'


def test_progress_log_waits_for_the_work_and_reports_it(caplog):
  progress = ProgressLog('valid evaluation', total=4, interval=0.0)
  with caplog.at_level(logging.INFO, logger='lm_zoo'):
    for done in range(1, 5):
      progress.update(done, np.zeros(3))
  lines = [r.getMessage() for r in caplog.records]
  # The last update is the loop's end, which the caller reports itself.
  assert len(lines) == 3 and lines[0].startswith('valid evaluation: 1/4 windows (25%), ETA')
  quiet = ProgressLog('x', total=10, interval=3600.0)
  caplog.clear()
  with caplog.at_level(logging.INFO, logger='lm_zoo'):
    quiet.update(5)
  assert not caplog.records


class _Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_throughput_eta_keeps_the_pace_since_the_first_line(monkeypatch):
  """The first line's interval holds the compilation; later ETAs use the pace
  from the first line on (a validation pause included), not the last interval."""
  clock = _Clock()
  monkeypatch.setattr('lm_zoo.progress.time.perf_counter', clock)
  throughput = Throughput()

  def train(updates, seconds):
    for _ in range(updates):
      throughput.add(100)
    clock.now += seconds

  train(10, 50.0)  # 45 s of it compiling
  assert throughput.rate() == 20.0
  assert throughput.eta(100) == '8m20s'  # 5 s an update so far
  throughput.reset()
  train(10, 10.0)
  assert throughput.rate() == 100.0 and throughput.eta(100) == '1m40s'
  clock.now += 20.0  # a validation turn, then the loop resets the interval
  throughput.reset()
  train(10, 10.0)
  assert throughput.rate() == 100.0  # training alone
  assert throughput.eta(100) == '3m20s'  # 40 s for 20 updates since the first line
