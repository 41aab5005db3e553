"""lm_zoo.interrupts: Ctrl-C that would otherwise be lost."""

import os
import signal

import pytest

from lm_zoo import interrupts


@pytest.fixture
def python_sigint():
  """SIGINT handled as Python does by default (pytest-xdist workers ignore it)."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)
  interrupts._received.clear()


def test_ctrl_c_is_raised_and_remembered(python_sigint):
  """An extension interrupted while it loads may print the KeyboardInterrupt
  and raise another error: the program still knows Ctrl-C came."""
  interrupts.record_interrupts()
  assert not interrupts.interrupted()
  with pytest.raises(KeyboardInterrupt):
    os.kill(os.getpid(), signal.SIGINT)
  assert interrupts.interrupted()


def test_an_ignored_sigint_stays_ignored(python_sigint):
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  interrupts.record_interrupts()
  assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
