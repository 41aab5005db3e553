"""`lm_zoo.cli.run`: an error is one line on stderr, whatever the failed job
left behind."""

import asyncio
import gc
import logging
import signal
import time

import pytest

from lm_zoo import cli
from lm_zoo.errors import CheckpointError


def _job_leaving_a_failed_task_nobody_awaited():
  """What a failed orbax restore does: of its concurrent reads, the first
  error is raised and the others' are never retrieved."""
  async def read():
    raise ValueError('OUT_OF_RANGE: Error reading "softmax.bias/0"')

  loop = asyncio.new_event_loop()
  task = loop.create_task(read())
  loop.run_until_complete(asyncio.sleep(0))
  loop.close()
  del task
  gc.collect()  # asyncio reports the never-retrieved error when the task is freed
  raise CheckpointError('the checkpoint run/best/10 is corrupt or truncated')


def test_errors_of_tasks_nobody_awaited_go_to_debug_not_stderr(capsys, caplog):
  with (caplog.at_level(logging.DEBUG, logger='lm_zoo.cli'),
        pytest.raises(SystemExit) as stopped):
    cli.run(_job_leaving_a_failed_task_nobody_awaited)
  assert stopped.value.code == 1
  assert capsys.readouterr().err == (
      'error: the checkpoint run/best/10 is corrupt or truncated\n')
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
  ignored = [r for r in caplog.records if r.name == 'lm_zoo.cli']
  assert len(ignored) == 1 and 'Task exception was never retrieved' in ignored[0].message
  assert 'OUT_OF_RANGE' in caplog.text


@pytest.fixture
def python_sigint():
  """Python's own SIGINT handler, as in a program: pytest-xdist workers ignore SIGINT."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


class _InterruptedFinaliser:
  def __del__(self):
    raise KeyboardInterrupt  # where Ctrl-C lands when a finaliser is running


def test_ctrl_c_that_lands_in_a_finaliser_still_stops_the_program(capsys, python_sigint):
  """Python prints such an interrupt and ignores it; the program would run
  on to its end. It is raised again, and the program stops with 130."""
  def job():
    finaliser = _InterruptedFinaliser()
    del finaliser
    for _ in range(500):  # a job that would otherwise finish in ~5 s
      time.sleep(0.01)
    return 'finished'

  with pytest.raises(SystemExit) as stopped:
    cli.run(job)
  assert stopped.value.code == 130
  assert capsys.readouterr().err.strip() == 'interrupted'
