"""Progress lines with an ETA, and durations as text."""

import logging

import numpy as np
import pytest

from lm_zoo.progress import ProgressLog, eta, format_duration


@pytest.mark.parametrize('seconds, text', [(0, '0s'), (12.4, '12s'), (59.6, '1m00s'),
                                           (245, '4m05s'), (3720, '1h02m'),
                                           (float('inf'), '?')])
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
