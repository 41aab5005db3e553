"""lm_zoo.programs: how the console scripts start."""

from lm_zoo.programs import _caused_by_interrupt


def _raised(make):
  try:
    make()
  except Exception as err:  # what _launch catches
    return err
  raise AssertionError('nothing raised')


def _import_error_from(cause):
  def make():
    try:
      raise cause
    except BaseException as err:
      raise ImportError('numpy._core.multiarray failed to import') from err

  return make


def test_an_import_error_caused_by_ctrl_c_counts_as_the_interrupt():
  """A C extension interrupted while it loads raises ImportError from the
  KeyboardInterrupt (numpy does): that is Ctrl-C, not a bad flag."""
  assert _caused_by_interrupt(_raised(_import_error_from(KeyboardInterrupt())))
  assert _caused_by_interrupt(KeyboardInterrupt())


def test_other_errors_and_their_causes_do_not():
  assert not _caused_by_interrupt(_raised(_import_error_from(ValueError('bad'))))
  assert not _caused_by_interrupt(ValueError('bad'))
  assert not _caused_by_interrupt(None)
  looped = ValueError('a')
  looped.__context__ = ValueError('b')
  looped.__context__.__context__ = looped  # a cycle ends the walk
  assert not _caused_by_interrupt(looped)
