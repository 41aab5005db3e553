"""Ctrl-C that Python would swallow, raised again in the main thread.

Standard library only: lm_zoo.programs installs it before anything else is
imported, so that Ctrl-C is handled from a program's first moment.
"""

import _thread
import signal
import sys
import threading

_received = threading.Event()


def record_interrupts() -> None:
  """From now on Ctrl-C is remembered (`interrupted`) as it is raised: a C
  extension interrupted while it loads may print the KeyboardInterrupt and
  raise an unrelated error, with nothing chained to tell it came from Ctrl-C.
  Where SIGINT is ignored or handled by someone else, nothing changes."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _record_and_raise)


def _record_and_raise(signum, frame):
  _received.set()
  raise KeyboardInterrupt


def interrupted() -> bool:
  """Whether Ctrl-C came since `record_interrupts`."""
  return _received.is_set()


def interrupt_from_unraisable(unraisable) -> None:
  """A `sys.unraisablehook` that raises Ctrl-C again (`interrupt_again`)."""
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    interrupt_again()
  else:
    sys.__unraisablehook__(unraisable)


def interrupt_again() -> None:
  """Raises KeyboardInterrupt in the main thread again, a moment from now.

  Ctrl-C that lands in a finaliser or a garbage-collection callback is
  printed and ignored by Python (a run would train on to its end). Raised
  from the hook that is told of it, it would land in the hook itself; a
  timer thread raises it once the main thread has left the finaliser.
  """
  timer = threading.Timer(0.01, _thread.interrupt_main)
  timer.daemon = True
  timer.start()
