"""Bad inputs to a trained work directory, given on purpose (damaged or
swapped checkpoints and config.json, a run resumed with other shapes, bad
evaluation configs): each is one clear `error:` line naming the file or
field, exit status 1, and no traceback. Most run in process through
`cli.run` (what every program calls); one runs the real programs to show
the console, and that --verbose prints the traceback. A wrong argument of
the library is refused by a ValueError naming it. (Bad config fields:
test_bad_configs.py; bad data files: test_bad_data_files.py.)"""

import json
import shutil

import pytest
from conftest import run_script
from refusals import refused_in_one_line, tiny_config

from lm_zoo.configs import evaluation_config
from lm_zoo.training import evaluate_workdir, train_and_evaluate


def _evaluation(evaluator, **fields):
  config = evaluation_config(evaluator)
  config.update_from_flattened_dict(fields)
  return config


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  """A work directory of one finished epoch (latest and best checkpoints),
  with input dropout for MC dropout to scale."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  train_and_evaluate(tiny_config(data_dir, **{'model.dropout_input': 0.2}), workdir)
  return workdir


def _copy(trained, tmp_path):
  return shutil.copytree(trained, tmp_path / 'run')


def _largest_array_file(checkpoint_folder):
  return max(
    (p for p in checkpoint_folder.rglob('*') if p.parent.name == 'd'),
    key=lambda p: p.stat().st_size,
  )


def _truncate_best(d, t, w):
  step = next((w / 'best').iterdir())
  data = _largest_array_file(step)
  data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
  return lambda: evaluate_workdir(w)


def _garble_latest_meta(d, t, w):
  (w / 'checkpoints' / '10' / 'meta' / 'metadata').write_text('{"epoch": 2, "posi')
  return lambda: train_and_evaluate(tiny_config(d, **{'train.max_steps': 20}), w)


def _other_model_config(d, t, w):
  config = json.loads((w / 'config.json').read_text())
  config['model']['hidden_size'] = 24
  (w / 'config.json').write_text(json.dumps(config))
  return lambda: evaluate_workdir(w)


def _truncate_config(d, t, w):
  path = w / 'config.json'
  path.write_text(path.read_text()[:100])
  return lambda: evaluate_workdir(w)


# id -> (set-up(data_dir, tmp_path, a copy of the trained work directory) -> job,
#        what the error line says; {t} is tmp_path, {w} the copy)
CASES = {
  'resume with other shapes': (
    lambda d, t, w: (
      lambda: train_and_evaluate(
        tiny_config(d, **{'model.hidden_size': 24, 'train.max_steps': 20}), w
      )
    ),
    'holds a run with a different model.hidden_size (16 there, 24 now)',
  ),
  'corrupt checkpoint file': (
    _garble_latest_meta,
    'checkpoints/10 is corrupt or truncated: unreadable JSON in {w}/checkpoints/10/meta/metadata; '
    'delete {w}/checkpoints/10, or train again in a new --workdir.',
  ),
  'truncated checkpoint': (_truncate_best, 'is corrupt or truncated: OUT_OF_RANGE'),
  'checkpoint from another model': (
    _other_model_config,
    'does not fit this model:\n  head/kernel: saved',
  ),
  'truncated config.json': (_truncate_config, 'config.json is corrupt or truncated'),
  'evaluate a non-workdir': (
    lambda d, t, w: lambda: evaluate_workdir(t / 'empty'),
    'is {t}/empty a work directory written by lm-zoo-train?',
  ),
  'bad temperature': (
    lambda d, t, w: (
      lambda: evaluate_workdir(w, _evaluation('static', **{'static.temperature': -1.0}))
    ),
    'temperature must be a positive number',
  ),
  'dropout scaled past 1': (
    lambda d, t, w: (
      lambda: evaluate_workdir(
        w, _evaluation('mc_dropout', **{'mc_dropout.samples': 2, 'mc_dropout.dropout_scale': 10.0})
      )
    ),
    'dropout_scale: dropout scaled by 10.0 leaves rates outside [0, 1)',
  ),
  'unknown dynamic evaluation': (
    lambda d, t, w: lambda: evaluate_workdir(w, _evaluation('dynamic', **{'dynamic.rule': 'adam'})),
    "dynamic.rule 'adam' is unknown",
  ),
}


@pytest.mark.parametrize('case', CASES)
def test_bad_input_is_one_clear_error_line(case, data_dir, trained, tmp_path, capsys):
  set_up, expected = CASES[case]
  workdir = _copy(trained, tmp_path)
  job = set_up(data_dir, tmp_path, workdir)
  assert expected.format(t=tmp_path, w=workdir) in refused_in_one_line(job, capsys)


def test_the_programs_print_one_line_and_verbose_adds_the_traceback(tmp_path, trained):
  args = [
    'launch/train.py',
    '--config=experiments/default.py',
    f'--workdir={tmp_path}',
    '--config.model.hidden_size=-5',
  ]
  quiet = run_script(args)
  assert quiet.returncode == 1 and 'Traceback' not in quiet.stderr
  assert quiet.stderr.strip().endswith(
    'error: config field model.hidden_size=-5 must be at least 1 (--config.model.hidden_size)'
  )
  verbose = run_script([*args, '--verbose'])
  assert verbose.returncode == 1
  assert 'Traceback (most recent call last)' in verbose.stderr
  assert 'lm_zoo/training/config_checks.py' in verbose.stderr
  assert 'error: config field' in verbose.stderr
  workdir = _copy(trained, tmp_path)
  _truncate_best(None, tmp_path, workdir)
  broken = run_script(['launch/evaluate.py', f'--workdir={workdir}'])
  assert broken.returncode == 1 and 'Traceback' not in broken.stderr
  assert f'error: the checkpoint {workdir}/best/10 is corrupt or truncated' in broken.stderr
  assert 'best/ keeps no other copy: train again in a new --workdir' in broken.stderr


def _api_cases():
  """Calls of the library with one wrong argument: (call, the message's text)."""
  import jax
  import numpy as np

  from lm_zoo.cells import LSTMCell, Mogrify
  from lm_zoo.evaluation import token_losses
  from lm_zoo.generation import sample
  from lm_zoo.layers import LowRankDense
  from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
  from lm_zoo.optim import dynamic_rms, dynamic_sgd

  model = RecurrentLM(Embedding(7, 4), Stack([LSTMCell(4)]), Softmax(7))
  params = init_params(model, jax.random.key(0))
  prompt = np.zeros((1, 2), np.int32)
  return {
    'NaN sampling temperature': (
      lambda: sample(model, params, prompt, 3, jax.random.key(0), float('nan')),
      'temperature must be a positive number, got nan',
    ),
    'prompt id past the vocabulary': (
      lambda: sample(model, params, np.array([[1, 7]]), 3, jax.random.key(0)),
      'prompt: token ids must be in [0, 7)',
    ),
    'stream id past the vocabulary': (
      lambda: token_losses(model, params, np.array([1, 9, 2])),
      'ids: token ids must be in [0, 7)',
    ),
    'NaN dynamic learning rate': (
      lambda: dynamic_sgd(float('nan')),
      'learning_rate must be a number >= 0, got nan',
    ),
    'negative dynamic decay': (
      lambda: dynamic_sgd(0.1, -0.5),
      'decay must be a number >= 0, got -0.5',
    ),
    'RMS epsilon 0': (lambda: dynamic_rms(0.1, 0.0, 0.0, params), 'eps must be positive'),
    'negative rounds': (lambda: Mogrify(LSTMCell(4), rounds=-1), 'rounds must be an integer >= 0'),
    'rank past the matrix': (
      lambda: LowRankDense(3, rank=5).init(jax.random.key(0), np.zeros((1, 4))),
      'rank 5 is larger than the (4, 3) matrix',
    ),
  }


@pytest.mark.parametrize(
  'case',
  [
    'NaN sampling temperature',
    'prompt id past the vocabulary',
    'stream id past the vocabulary',
    'NaN dynamic learning rate',
    'negative dynamic decay',
    'RMS epsilon 0',
    'negative rounds',
    'rank past the matrix',
  ],
)
def test_a_wrong_argument_of_the_library_is_refused_naming_it(case):
  call, expected = _api_cases()[case]
  with pytest.raises(ValueError) as refused:
    call()
  assert expected in str(refused.value)
