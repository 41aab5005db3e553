"""Ctrl-C that Python would swallow, raised again in the main thread.

Standard library only: lm_zoo.programs installs it before anything else is
imported, so that Ctrl-C is handled from a program's first moment.
"""

import _thread
import signal
import sys
import threading

_received = threading.Event()


def defer_interrupts() -> None:
  """From now on Ctrl-C is remembered (`interrupted`), not raised, until
  `raise_interrupts`: a C extension interrupted while it loads prints the
  KeyboardInterrupt's traceback itself and raises an unrelated error. A
  second Ctrl-C raises at once. Where SIGINT is ignored or handled by
  someone else, nothing changes."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _remember)


def _remember(signum, frame):
  if _received.is_set():
    raise KeyboardInterrupt  # asked twice: now
  _received.set()


def raise_interrupts() -> None:
  """Ctrl-C raises KeyboardInterrupt again, as Python's default handler does."""
  if signal.getsignal(signal.SIGINT) is _remember:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupted() -> bool:
  """Whether Ctrl-C came while it was deferred."""
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
