"""The command-line programs (`lm-zoo-train`, `lm-zoo-eval`, `lm-zoo-generate`,
`lm-zoo-download`, `lm-zoo-tune`, `lm-zoo-plot`, `lm-zoo-task`, also run as
`python launch/NAME.py`) and their shared set-up.

Each program is a module of this package that defines its absl flags when
imported, so import one per process (through `main`), never two. Every
program also takes --verbose (defined here), for tracebacks.
"""

import errno
import inspect
import logging
import os
import pathlib
import re
import shlex
import signal
import sys
import traceback
import types
from typing import Callable, NoReturn, TypeVar

import ml_collections
from absl import app, flags
from absl import logging as absl_logging

from lm_zoo import configs
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError, LMZooError, Preempted, missing_extra
from lm_zoo.interrupts import interrupt_again
from lm_zoo.runtime import retain_host_memory

# The experiment configs installed with the package (lm_zoo/experiments),
# where the programs' default configs are.
EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / 'experiments'

# Shared by every program: one program module is imported per process, so the
# flag is defined once.
flags.DEFINE_bool(
  'verbose', False, 'Print the traceback of an error as well as its one-line message.'
)
T = TypeVar('T')

# The programs' data folder, where a config or flag names none. The library
# never reads it: it takes the folder as an argument.
DATA_DIR_ENV = 'LM_ZOO_DATA'
DATA_DIR_HELP = (
  "Where the run's data is now, if not where the run recorded it (default: "
  f'the recorded folder, else ${DATA_DIR_ENV}, else shared/data beside the '
  'checkout).'
)


def command_line() -> str:
  """This process' command line as one would type it again: a console
  script by its name, a script as `python PATH`."""
  program = sys.argv[0]
  words = ['python', program] if program.endswith('.py') else [pathlib.Path(program).name]
  return shlex.join(words + sys.argv[1:])


def env_data_dir() -> str:
  """$LM_ZOO_DATA, or '' where it is unset."""
  return os.environ.get(DATA_DIR_ENV, '')


def with_env_data_dir(config: ml_collections.ConfigDict) -> None:
  """Fills every empty `data.data_dir` of a standard corpus in `config` (a
  training config, or a study's, whose runs' configs it holds) and a task's
  empty `data_dir` (MNIST) with $LM_ZOO_DATA, so that each run records where
  its data was."""
  from lm_zoo.data import CORPORA

  if not env_data_dir():
    return
  data = config.get('data')
  if isinstance(data, ml_collections.ConfigDict) and not data.get('data_dir', True):
    if data.get('name') in CORPORA:
      data.data_dir = env_data_dir()
  elif 'data_dir' in config and not config.data_dir:
    config.data_dir = env_data_dir()
  for value in config.values():
    if isinstance(value, ml_collections.ConfigDict) and value is not data:
      with_env_data_dir(value)


def workdir_data_dir(workdir: str | os.PathLike, data_dir: str | None) -> str | None:
  """The data folder of a program that reads `workdir`'s model: `data_dir`
  (its --data_dir), else None where the run recorded a folder, else
  $LM_ZOO_DATA (None where unset)."""
  if data_dir:
    return data_dir
  from lm_zoo.runs.finished import load_config

  try:
    recorded = load_config(workdir).data.data_dir
  except LMZooError:  # not a work directory: the program says so, after its own checks
    recorded = ''
  return None if recorded else env_data_dir() or None


def run(job: Callable[[], T]) -> T:
  """Runs `job` with lm_zoo's progress shown and its errors as one clear line.

  lm_zoo's INFO lines go to the console; libraries' (orbax's) only from WARNING.
  An error ends the process with one line instead of a traceback (--verbose
  prints the traceback too), exit status 1: an `LMZooError` with its message,
  anything else with its type and a request to report it. Training stopped by
  SIGTERM or SIGINT (`Preempted`, after its checkpoint) or an interrupt
  elsewhere exits with 128 + the signal's number (143, 130), the status a
  shell gives a process that signal stopped, so a scheduler sees the run did
  not finish. Before the job, malloc is set to keep freed memory
  (`lm_zoo.runtime.retain_host_memory`).
  """
  retain_host_memory()
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('lm_zoo').setLevel(logging.INFO)
  if not flags.FLAGS['verbose'].value:
    # A failed orbax restore leaves reads in flight whose callbacks fail on its
    # closed event loop, and failed reads nobody awaited; Python and asyncio
    # would print each one's traceback after the error's line.
    sys.unraisablehook = _log_unraisable
    logging.getLogger('asyncio').addFilter(_unretrieved_task_errors_to_debug)
    # A failed orbax write (a full disk) logs each of its threads' traceback;
    # the error itself reaches the job, and is reported below in one line.
    logging.getLogger('absl').addFilter(_thread_failures_to_debug)
    # Optuna logs a failed trial's traceback; an lm_zoo error (a config a
    # trial cannot train, a signal that stopped it) is the trial's line.
    logging.getLogger('optuna.study._optimize').addFilter(_lm_zoo_trial_failures_in_one_line)
  try:
    return job()
  except Preempted as err:
    _report(f'stopped: {err}', err.signum + 128)
  except KeyboardInterrupt:
    _report('interrupted', signal.SIGINT + 128)
  except LMZooError as err:
    _report(f'error: {err}', 1)
  except ModuleNotFoundError as err:
    _report(f'error: {missing_extra(err) or _unexpected(err)}', 1)
  except Exception as err:  # a bug, unless the disk failed: say which
    _report(f'error: {storage_fault(err) or _unexpected(err)}', 1)


def check_output(
  path: pathlib.Path, kind: str = 'JSON', flag: str = '--output', fix: str = ''
) -> None:
  """Checks, before a program's work, the file it writes at the end: its
  folder made where missing, and not a folder itself. Raises ConfigError
  naming `flag`=path (the path alone when `flag` is empty) and `fix`
  (default: name a `kind` file in a folder you can write)."""
  named = f'{flag}={path}' if flag else str(path)
  fix = fix or f'name a {kind} file in a folder you can write'
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as err:
    raise ConfigError(f'{named} cannot be written ({err.strerror}): {fix}') from None
  if path.is_dir():
    raise ConfigError(f'{named} is a folder: {fix}')


# What the disk or the file system refused: the machine's state, not a bug.
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def storage_fault(err: BaseException) -> str | None:
  """A write the disk or file system refused (full, over quota, read-only,
  not permitted, failing), in one line with what to do; None for anything
  else. orbax reports its writes' failures as ValueError with the OS error's
  number in the text."""
  if isinstance(err, OSError) and err.errno in _STORAGE_ERRNOS:
    number, where = err.errno, err.filename
  else:
    code = re.search(r"os_error_code='(\d+)'", str(err))
    if code is None or int(code.group(1)) not in _STORAGE_ERRNOS:
      return None
    number = int(code.group(1))
    path = re.search(r'(?:at local file|Failed writing:) "([^"]+)"', str(err))
    # the checkpoint, not orbax's temporary folder inside it
    where = path and re.sub(r'\.orbax-checkpoint-tmp.*', '', path.group(1))
  return (
    f'{os.strerror(number).lower()}' + (f': {where}' if where else '') + '. '
    'Nothing written before is lost: free space or fix the folder (or choose '
    'another), then run the same command again (training resumes from its '
    'latest checkpoint)'
  )


def _unexpected(err: Exception) -> str:
  return (
    f'unexpected {type(err).__name__}: {err}\n(run again with --verbose for the '
    'traceback, and please report it)'
  )


def _log_unraisable(unraisable) -> None:
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    interrupt_again()  # Ctrl-C that landed in a finaliser
    return
  logging.getLogger(__name__).debug('ignored in %r: %r', unraisable.object, unraisable.exc_value)


def _thread_failures_to_debug(record: logging.LogRecord) -> bool:
  if 'raised an exception' not in record.getMessage() or record.levelno < logging.ERROR:
    return True
  logging.getLogger(__name__).debug('%s', record.getMessage(), exc_info=record.exc_info)
  return False


def _lm_zoo_trial_failures_in_one_line(record: logging.LogRecord) -> bool:
  err = record.exc_info[1] if record.exc_info else None
  if isinstance(err, LMZooError) or isinstance(getattr(err, '__cause__', None), LMZooError):
    record.exc_info, record.exc_text = None, None
  return True


def _unretrieved_task_errors_to_debug(record: logging.LogRecord) -> bool:
  if not record.getMessage().startswith('Task exception was never retrieved'):
    return True
  logging.getLogger(__name__).debug('ignored: %s', record.getMessage(), exc_info=record.exc_info)
  return False


def _report(line: str, status: int) -> NoReturn:
  """Prints `line` (after the traceback with --verbose) and exits with `status`."""
  # FLAGS[...].value reads the default when no program parsed the flags.
  if flags.FLAGS['verbose'].value:
    traceback.print_exc()
  print(line, file=sys.stderr)
  sys.exit(status)


def main(
  command: types.ModuleType, program: Callable[[list[str]], None], more_help: str = ''
) -> None:
  """Runs `program` under absl as the process's main program.

  `--help` shows `command`'s docstring and its flags whether the process was
  started as `python launch/NAME.py` or as an installed console script (absl
  lists only the flags of the module it was started from), then `more_help`.
  """
  program_path = sys.argv[0]
  for flag in [*flags.FLAGS.get_flags_for_module(command.__name__), flags.FLAGS['verbose']]:
    flags.FLAGS.register_key_flag_for_module(program_path, flag)
  sys.modules['__main__'].__doc__ = command.__doc__ + more_help

  def program_with_usage_errors_in_one_line(argv: list[str]) -> None:
    try:
      program(argv)
    except app.UsageError as err:  # absl would print the whole --help before it
      _flag_exit(str(err))

  app.run(program_with_usage_errors_in_one_line, flags_parser=_parse_flags)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every error as one line: a bad flag value, a
  --config file that does not load (a missing file, an unknown variant) or
  a --config.FIELD override that names no field. The config file is loaded
  here, so that its errors are the command line's, not the program's."""
  try:
    remaining = flags.FLAGS(argv)
  except SystemExit as done:  # absl's --help exits 1 once the help is printed
    if done.code == 1 and any(arg.split('=')[0] in HELP_FLAGS for arg in argv[1:]):
      sys.exit(0)  # the help asked for was given: a success, so `--help && ...` goes on
    raise
  except Exception as err:  # flags.Error, and whatever a config file raises
    named = next(
      (name for name in CONFIG_FLAGS if any(arg.startswith(f'--{name}=') for arg in argv)), None
    )
    message = flag_error(err, argv)
    _flag_exit(
      _config_file_error(named, err, message, argv)
      if named and not isinstance(err, flags.Error)
      else message
    )
  for name in CONFIG_FLAGS:  # a file that failed to load raises on first use
    if name in flags.FLAGS:
      try:
        flags.FLAGS[name].value.keys()
      except Exception as err:
        _flag_exit(_config_file_error(name, err, flag_error(err, argv), argv))
  return remaining


def _config_file_error(name: str, err: Exception, message: str, argv: list[str]) -> str:
  """`message` about the config file of --NAME, naming the file where the
  error is the file's own (it raised, or defines no get_config)."""
  if not message.startswith('--'):
    path = next(
      (arg.split('=', 1)[1] for arg in argv if arg.startswith(f'--{name}=')),
      flags.FLAGS[name].default if name in flags.FLAGS else '',
    )
    message = (
      f'--config={path} does not load ({type(err).__name__}: {message}): fix '
      'the file, or name an experiments/*.py config that defines get_config()'
    )
  return message.replace('--config', f'--{name}', 1) if name != 'config' else message


# The programs' config-file flags (ml_collections' config_flags).
CONFIG_FLAGS = ('config', 'tune')
# absl's flags that print help and exit.
HELP_FLAGS = ('--help', '-help', '-h', '-?', '--helpshort', '--helpfull', '--helpxml')


def _flag_exit(message: str) -> None:
  print(f'error: {message}\nPass --help to see the flags.', file=sys.stderr)
  sys.exit(1)


def flag_error(err: Exception, argv: list[str]) -> str:
  """The flag that `err` is about, and why, in one line."""
  text = str(err)
  suggested = re.search(r'Did you mean "([\w.]+)" instead of "([\w.]+)"', text)
  missing = re.search(r"KeyError: '([\w.]+)'|^[\"']+([\w.]+)[\"']+$", text.replace('\\', ''))
  bad_field = (
    suggested.group(2) if suggested else missing and (missing.group(1) or missing.group(2))
  )
  if bad_field:
    flag = next(
      (
        arg.split('=')[0]
        for arg in argv
        if arg.startswith('--config.') and f'.{bad_field}.' in arg.split('=')[0] + '.'
      ),
      '--config',
    )
    return f'{flag}: no such config field' + (
      f'; did you mean {suggested.group(1)}?' if suggested else ''
    )
  lines = [line.strip() for line in text.replace('\\n', '\n').splitlines() if line.strip()]
  named = re.match(r'flag (--[^=\s]+)', lines[0]) if lines else None
  flag = named.group(1) if named else ('--config' if 'config file' in text else '')
  reason = re.sub(r'^flag --\S+?=\S*: ', '', lines[-1]) if lines else type(err).__name__
  return f'{flag}: {reason}' if flag else reason


# `c.section.field = default  # comment` in a config builder's source.
_ASSIGNMENT = re.compile(r'c\.([\w.]+) = ([^#]*?)\s*(?:#\s*(.*))?$')
# A section another builder of lm_zoo.configs makes: `c.evaluation = evaluation_config()`.
_BUILT = re.compile(r'(\w+)\(')


def describe_fields(builder: Callable[[], ml_collections.ConfigDict] = base_config) -> str:
  """Every field of the config `builder` returns (`base_config`,
  `evaluation_config`, ...) as `--config.FIELD=DEFAULT` and its comment,
  the fields of a section another builder makes included.

  The comments are the builders' own (beside a field or on the lines above
  it), so `--help` and the code say the same.
  """
  return '\n'.join(_field_lines(builder, builder().to_dict(), ''))


def _field_lines(builder, defaults: dict, prefix: str) -> list[str]:
  lines, comments = [], []
  for line in inspect.getsource(builder).splitlines():
    line = line.strip()
    if line.startswith('#'):
      comments.append(line.lstrip('# '))
      continue
    match = _ASSIGNMENT.match(line)
    if match:
      field, assigned, beside = match.groups()
      value = defaults
      for part in field.split('.'):
        value = value[part]
      text = ' '.join(comments + [beside] * bool(beside))
      if isinstance(value, dict):  # a section: its comment applies to its fields
        lines.append(f'  {prefix}{field}:' + (f' {text}' if text else ''))
        built = _BUILT.match(assigned)
        section_builder = built and getattr(configs, built.group(1), None)
        if callable(section_builder):
          lines += _field_lines(section_builder, value, f'{prefix}{field}.')
      else:
        lines.append(f'    --config.{prefix}{field}={value!r}' + (f'  # {text}' if text else ''))
    comments = []
  return lines
