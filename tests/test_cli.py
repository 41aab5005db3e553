"""`lm_zoo.cli.run`: an error is one line on stderr, whatever the failed job
left behind."""

import ast
import asyncio
import errno
import gc
import logging
import pathlib
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
  gc.collect()  # earlier tests' garbage (orbax's failed reads) is freed before the job, not in it
  with caplog.at_level(logging.DEBUG, logger='lm_zoo.cli'), pytest.raises(SystemExit) as stopped:
    cli.run(_job_leaving_a_failed_task_nobody_awaited)
  assert stopped.value.code == 1
  assert capsys.readouterr().err == ('error: the checkpoint run/best/10 is corrupt or truncated\n')
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


_ORBAX_FULL_DISK = ValueError(
  'RESOURCE_EXHAUSTED: Error writing "cell_0.kernel/0.0" in OCDBT database at local file '
  '"/runs/a/best/29.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": '
  'Failed writing: "/runs/a/best/29.orbax-checkpoint-tmp/d/80": Failed to write 14946304 '
  "bytes to file 21: No space left on device [os_error_code='28']"
)


@pytest.mark.parametrize(
  'error, line',
  [
    (
      OSError(errno.ENOSPC, 'No space left on device', '/runs/a/metrics.jsonl'),
      'error: no space left on device: /runs/a/metrics.jsonl. Nothing written before is lost',
    ),
    (
      OSError(errno.EROFS, 'Read-only file system', '/runs/a'),
      'error: read-only file system: /runs/a. Nothing written before is lost',
    ),
    (_ORBAX_FULL_DISK, 'error: no space left on device: /runs/a/best/29. Nothing'),
    (ValueError("os_error_code='2' missing"), 'error: unexpected ValueError'),
  ],
  ids=['full disk', 'read-only', 'orbax full disk', 'not the disk'],
)
def test_a_refused_write_is_one_line_and_not_called_a_bug(error, line, capsys):
  def job():
    # orbax logs each failed writer thread's traceback before the error reaches the job
    try:
      raise error
    except Exception:
      logging.getLogger('absl').error(
        '[thread=array_type_handler] _SignalingThread.run() raised an exception: %s',
        error,
        exc_info=True,
      )
    raise error

  with pytest.raises(SystemExit) as stopped:
    cli.run(job)
  assert stopped.value.code == 1
  err = capsys.readouterr().err
  assert err.startswith(line) and 'Traceback' not in err, err
  assert ('please report it' in err) == line.startswith('error: unexpected')


def test_the_programs_fill_each_run_s_empty_data_folder_from_the_environment(monkeypatch):
  """A training config, a study holding runs' configs, and a task's own
  data_dir; a folder already named and one's own text are left alone."""
  import ml_collections

  from lm_zoo.configs import base_config

  monkeypatch.setenv(cli.DATA_DIR_ENV, '/data/here')
  study = ml_collections.ConfigDict(
    {'models': {'a': base_config(), 'b': base_config()}, 'data_dir': ''}
  )
  study.models.b.data.data_dir = '/elsewhere'
  text = base_config()
  text.data.name = 'text'
  cli.with_env_data_dir(study)
  cli.with_env_data_dir(text)
  assert study.models.a.data.data_dir == '/data/here' and study.data_dir == '/data/here'
  assert study.models.b.data.data_dir == '/elsewhere' and text.data.data_dir == ''
  monkeypatch.delenv(cli.DATA_DIR_ENV)
  unset = base_config()
  cli.with_env_data_dir(unset)
  assert unset.data.data_dir == ''


def test_a_run_s_recorded_data_folder_wins_over_the_environment(tmp_path, monkeypatch):
  from lm_zoo.configs import base_config
  from lm_zoo.runs.workdir import save_config

  monkeypatch.setenv(cli.DATA_DIR_ENV, '/from/env')
  config = base_config()
  save_config(config, tmp_path)
  assert cli.workdir_data_dir(tmp_path, None) == '/from/env'  # the run recorded none
  assert cli.workdir_data_dir(tmp_path, '/flag') == '/flag'
  config.data.data_dir = '/recorded'
  save_config(config, tmp_path)
  assert cli.workdir_data_dir(tmp_path, None) is None  # load_trained reads /recorded


def test_a_tasks_table_has_every_rows_scalar_columns_and_a_dash_where_one_lacks_it():
  """A seed study's rows: a diverged run has no dynamic-evaluation fields,
  and the chosen settings (a dict) are no column."""
  from lm_zoo.cli.task import result_table

  rows = [
    {'model': 'lstm', 'seed': 0, 'valid_perplexity': float('inf')},
    {
      'model': 'lstm',
      'seed': 1,
      'valid_perplexity': 80.5,
      'rms_valid_perplexity': 75.25,
      'rms_settings': {'learning_rate': 1e-4},
    },
  ]
  header, *lines = result_table(rows).splitlines()
  assert header.split() == ['model', 'seed', 'valid_perplexity', 'rms_valid_perplexity']
  assert lines[0].split() == ['lstm', '0', 'inf', '-']
  assert lines[1].split() == ['lstm', '1', '80.5000', '75.2500']


@pytest.mark.parametrize(
  'program',
  ['download', 'evaluate', 'export', 'generate', 'meta_train', 'plot', 'task', 'train', 'tune'],
)
def test_every_line_of_a_program_s_help_text_is_shown(program):
  """--help prints the module's docstring: a line of an example that ends in
  a backslash (a shell's continuation) must not join the next one, as it
  does in a string that is not raw."""
  tree = ast.parse((pathlib.Path(cli.__file__).parent / f'{program}.py').read_text())
  shown, docstring = ast.get_docstring(tree, clean=False), tree.body[0]
  assert shown.count('\n') == docstring.end_lineno - docstring.lineno
