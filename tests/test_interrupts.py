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


def test_ctrl_c_is_deferred_remembered_and_a_second_one_raises(python_sigint):
  """While the libraries load, Ctrl-C is remembered, not raised (an extension
  interrupted mid-import prints a traceback of its own); asked twice, it raises."""
  interrupts.defer_interrupts()
  assert not interrupts.interrupted()
  os.kill(os.getpid(), signal.SIGINT)
  assert interrupts.interrupted()
  with pytest.raises(KeyboardInterrupt):
    os.kill(os.getpid(), signal.SIGINT)
  interrupts.raise_interrupts()
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored(python_sigint):
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  interrupts.defer_interrupts()
  assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  interrupts.raise_interrupts()
  assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
