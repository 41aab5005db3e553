"""Command lines the programs refuse, run as the programs (absl's and
ml_collections' parsing included): one `error:` line naming the flag or
field, exit status 1, no traceback."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, run_scripts

# Command lines the flag parsers refuse: (program, flags, the line's text).
COMMAND_LINES = {
  'config field typo': (
    'train',
    ['--config=experiments/default.py', '--config.model.hiden_size=3'],
    'error: --config.model.hiden_size: no such config field; did you mean hidden_size?',
  ),
  'missing config file': (
    'train',
    ['--config=experiments/nope.py'],
    "error: --config: [Errno 2] No such file or directory: 'experiments/nope.py'",
  ),
  'missing config file, overrides': (
    'train',
    ['--config=experiments/nope.py', '--config.model.hidden_size=3'],
    'error: --config: [Errno 2] No such file',
  ),
  'unknown variant': (
    'evaluate',
    ['--config=experiments/dyneval_rms.py:nope'],
    'error: --config: ValueError: variant must be one of lamb, krause',
  ),
  'unknown section': (
    'evaluate',
    ['--config.nosection.x=1'],
    'error: --config.nosection.x: no such config field',
  ),
  'not a number': (
    'evaluate',
    ['--config.static.temperature=warm'],
    'error: --config.static.temperature: could not convert string to float',
  ),
  'unknown flag': ('generate', ['--top_p=0.9'], "error: Unknown command line flag 'top_p'"),
  'negative seeds': ('train', ['--seeds=-1'], 'error: --seeds: -1 is not a non-negative integer'),
  'unknown recipe schedule': (
    'train',
    ['--config=experiments/ptb_lstm_medium.py:text'],
    "error: --config: ValueError: schedule must be 'code' or 'paper', got 'text'",
  ),
}


# Values the programs refuse before any work: (program and flags, the line's text).
TRAIN = ['launch/train.py', '--config=experiments/default.py']
VALUES = {
  'clip_norm nan': (
    [*TRAIN, '--config.optimizer.clip_norm=nan'],
    'config field optimizer.clip_norm=nan must be a number',
  ),
  'init_scale nan': (
    [*TRAIN, '--config.model.init_scale=nan'],
    'config field model.init_scale=nan must be a number >= 0',
  ),
  'init_scale negative': (
    [*TRAIN, '--config.model.init_scale=-0.1'],
    'config field model.init_scale=-0.1 must be a number >= 0',
  ),
  'test_tokens negative': (
    [*TRAIN, '--config.data.test_tokens=-5'],
    'config field data.test_tokens=-5 must be >= 0',
  ),
  'tuning timeout negative': (
    ['launch/tune.py', '--timeout=-1', '--tune=experiments/tune_ptb_small.py:mogrifier'],
    'timeout must be >= 0 seconds',
  ),
}


@pytest.fixture(scope='module')
def refusals(tmp_path_factory):
  """{case: CompletedProcess} of this file's refused command lines, each
  with a work directory of its own."""
  folder = tmp_path_factory.mktemp('refused')
  lines = {
    case: [f'launch/{program}.py', *bad_flags]
    for case, (program, bad_flags, _) in COMMAND_LINES.items()
  }
  lines.update({case: args for case, (args, _) in VALUES.items()})
  ran = run_scripts(
    [[s, f'--workdir={folder / str(k)}', *a] for k, (s, *a) in enumerate(lines.values())]
  )
  return dict(zip(lines, ran))


@pytest.mark.parametrize('case', COMMAND_LINES)
def test_a_bad_command_line_is_one_error_line(case, refusals):
  _, _, expected = COMMAND_LINES[case]
  refused = refusals[case]
  assert refused.returncode == 1 and 'Traceback' not in refused.stderr
  assert refused.stderr.startswith(expected), refused.stderr
  assert len(refused.stderr.strip().splitlines()) == 2  # and where to find the flags


def test_ctrl_c_while_the_libraries_load_is_one_line(tmp_path):
  """SIGINT during the imports (JAX takes seconds to load) exits 130 with
  one line, before any training."""
  process = subprocess.Popen(
    [sys.executable, 'launch/train.py', '--config=experiments/default.py', f'--workdir={tmp_path}'],
    cwd=REPO,
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
    # pytest-xdist workers ignore SIGINT, and children inherit that.
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  time.sleep(0.5)
  process.send_signal(signal.SIGINT)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 130, err
  assert 'Traceback' not in err and err.strip().splitlines()[-1] in (
    'interrupted',
    'stopped: SIGINT',
  )
  assert not (tmp_path / 'checkpoints').exists()


@pytest.mark.parametrize('case', VALUES)
def test_a_wrong_value_is_refused_by_the_program(case, refusals):
  refused = refusals[case]
  assert refused.returncode == 1 and 'Traceback' not in refused.stderr
  assert refused.stderr.strip().startswith(f'error: {VALUES[case][1]}'), refused.stderr
