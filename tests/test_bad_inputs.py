"""Bad inputs, given on purpose: each is one clear `error:` line naming the
field, file or parameter, exit status 1, and no traceback. Most run in
process through `cli.run` (what every program calls); a few run the real
programs to show the console, and that --verbose prints the traceback."""

import json
import logging
import os
import shutil

import pytest
from conftest import run_script

from lm_zoo import cli
from lm_zoo.configs import base_config, evaluation_config
from lm_zoo.data import load_corpus
from lm_zoo.training import evaluate_workdir, train_and_evaluate
from lm_zoo.tuning import param, run_worker, tuning_config

TINY = {
  'data.batch_size': 4,
  'data.bptt': 10,
  'data.eval_batch_size': 3,
  'data.test_batch_size': 2,
  'data.train_tokens': 401,
  'data.valid_tokens': 121,
  'data.test_tokens': 81,
  'model.embed_size': 16,
  'model.hidden_size': 16,
  'model.dropout_input': 0.2,
  'train.max_steps': 10,
  'train.log_every': 5,
  'generate.num_lines': 0,
}


def _evaluation(evaluator, **fields):
  config = evaluation_config(evaluator)
  config.update_from_flattened_dict(fields)
  return config


def _config(data_dir, **fields):
  config = base_config()
  config.update_from_flattened_dict({**TINY, 'data.data_dir': str(data_dir), **fields})
  return config


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  """A work directory of one finished epoch (latest and best checkpoints)."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  train_and_evaluate(_config(data_dir), workdir)
  return workdir


def _copy(trained, tmp_path):
  return shutil.copytree(trained, tmp_path / 'run')


def _data_folder(tmp_path, data_dir, train: bytes | None):
  """A data folder whose ptb/train.txt is `train` (None: left out), the real
  valid and test files beside it."""
  folder = tmp_path / 'data' / 'ptb'
  folder.mkdir(parents=True)
  for split in ('valid', 'test'):
    os.symlink(data_dir / 'ptb' / f'{split}.txt', folder / f'{split}.txt')
  if train is not None:
    (folder / 'train.txt').write_bytes(train)
  return folder.parent


def _largest_array_file(checkpoint_folder):
  return max(
    (p for p in checkpoint_folder.rglob('*') if p.parent.name == 'd'),
    key=lambda p: p.stat().st_size,
  )


def _train(**fields):
  return lambda d, t, w: lambda: train_and_evaluate(_config(d, **fields), t / 'new')


def _truncate_best(d, t, w):
  step = next((w / 'best').iterdir())
  data = _largest_array_file(step)
  data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
  return lambda: evaluate_workdir(w)


def _garble_latest_meta(d, t, w):
  (w / 'checkpoints' / '10' / 'meta' / 'metadata').write_text('{"epoch": 2, "posi')
  return lambda: train_and_evaluate(_config(d, **{'train.max_steps': 20}), w)


def _other_model_config(d, t, w):
  config = json.loads((w / 'config.json').read_text())
  config['model']['hidden_size'] = 24
  (w / 'config.json').write_text(json.dumps(config))
  return lambda: evaluate_workdir(w)


def _truncate_config(d, t, w):
  path = w / 'config.json'
  path.write_text(path.read_text()[:100])
  return lambda: evaluate_workdir(w)


def _tune(**fields):
  """A tuning worker whose tuning config has `fields` set."""

  def set_up(d, t, w):
    tune = tuning_config()
    tune.base = _config(d)
    tune.space.learning_rate = param('optimizer.learning_rate', 1e-3, 1e-2, log=True)
    tune.update_from_flattened_dict(fields)
    return lambda: run_worker(tune, t / 'tune')

  return set_up


def _data(train, **fields):
  return lambda d, t, w: (
    lambda: train_and_evaluate(_config(_data_folder(t, d, train), **fields), t / 'new')
  )


# id -> (set-up(data_dir, tmp_path, a copy of the trained work directory) -> job,
#        what the error line says)
CASES = {
  'unknown model': (
    _train(**{'model.cell': 'lsmt'}),
    "model.cell='lsmt' is not known: choose one of lstm, mlstm",
  ),
  'negative hidden size': (
    _train(**{'model.hidden_size': -5}),
    'model.hidden_size=-5 must be at least 1',
  ),
  'zero layers': (_train(**{'model.num_layers': 0}), 'model.num_layers=0 must be at least 1'),
  'dropout 1.0': (
    _train(**{'model.dropout_hidden': 1.0}),
    r'model.dropout_hidden=1.0 must be in [0, 1)',
  ),
  'negative weight drop': (
    _train(**{'model.weight_drop': -0.1}),
    'model.weight_drop=-0.1 must be in [0, 1)',
  ),
  'Mogrifier rank > hidden': (
    _train(**{'model.mogrifier.rounds': 2, 'model.mogrifier.rank': 64}),
    'model.mogrifier.rank=64 is larger than the matrices it factorises (model.embed_size is 16)',
  ),
  'negative Mogrifier rounds': (
    _train(**{'model.mogrifier.rounds': -1}),
    'model.mogrifier.rounds=-1 must be >= 0',
  ),
  'capped gate on a GRU': (
    _train(**{'model.cell': 'gru', 'model.cap_input_gate': True}),
    "model.cap_input_gate=True applies to the cells lstm, mlstm, alstm, not model.cell='gru'",
  ),
  'second gate bias on an mLSTM': (
    _train(**{'model.cell': 'mlstm', 'model.recurrent_bias': True}),
    "model.recurrent_bias=True applies to model.cell='lstm', not model.cell='mlstm'",
  ),
  'skip connections over layers of two sizes': (
    _train(**{'model.skip_connections': True, 'model.output_size': 8}),
    "model.skip_connections=True sums the layers' outputs, which needs layers of one size",
  ),
  'state drop 1.0': (
    _train(**{'train.drop_state': 1.0}),
    r'train.drop_state=1.0 must be in [0, 1)',
  ),
  'negative averaging patience': (
    _train(**{'averaging.patience_steps': -5}),
    'averaging.patience_steps=-5 must be >= 0',
  ),
  'unknown dtype': (_train(**{'model.dtype': 'float16'}), "model.dtype='float16' is not known"),
  'unknown dataset': (
    _train(**{'data.name': 'ptb2'}),
    "data.name='ptb2' is not known: choose one of ptb, wikitext2",
  ),
  'zero BPTT': (_train(**{'data.bptt': 0}), 'data.bptt=0 must be at least 1'),
  'unknown optimizer': (
    _train(**{'optimizer.name': 'adamw'}),
    "optimizer.name='adamw' is not known: choose one of sgd, adam, nadam",
  ),
  'negative learning rate': (
    _train(**{'optimizer.learning_rate': -0.1}),
    'optimizer.learning_rate=-0.1 must be >= 0',
  ),
  'NaN learning rate': (
    _train(**{'optimizer.learning_rate': float('nan')}),
    'optimizer.learning_rate=nan must be >= 0',
  ),
  'unknown loss reduction': (
    _train(**{'optimizer.loss_reduction': 'sum'}),
    "optimizer.loss_reduction='sum' is not known",
  ),
  'unknown schedule': (
    _train(**{'schedule.kind': 'cosine'}),
    "schedule.kind='cosine' is not known",
  ),
  'unknown averaging': (
    _train(**{'averaging.trigger': 'ema'}),
    "averaging.trigger='ema' is not known",
  ),
  'unknown fault policy': (
    _train(**{'train.nonfinite': 'ignore'}),
    "train.nonfinite='ignore' is not known: choose one of stop, skip",
  ),
  'rollback factor above 1': (
    _train(**{'train.rollback_lr_factor': 2.0}),
    'train.rollback_lr_factor=2.0 must be in (0, 1]',
  ),
  'BPTT longer than the data': (
    _train(**{'data.train_tokens': 41, 'data.bptt': 50}),
    'data.bptt=50 is longer than each of the data.batch_size=4 rows the training '
    'split is cut into (10 steps)',
  ),
  'batch larger than the stream': (
    _train(**{'data.train_tokens': 4}),
    'data.batch_size=4 is more rows than the 3 (input, target) pairs of the train split',
  ),
  'eval batch larger than valid': (
    _train(**{'data.valid_tokens': 3}),
    'data.eval_batch_size=3 is more rows than the 2 (input, target) pairs of the valid',
  ),
  'missing data folder': (
    lambda d, t, w: lambda: train_and_evaluate(_config(t / 'nope'), t / 'new'),
    'data folder {t}/nope does not exist',
  ),
  'missing corpus folder': (
    lambda d, t, w: lambda: train_and_evaluate(_config(t), t / 'new'),
    'corpus folder {t}/ptb is missing',
  ),
  'missing data file': (_data(None), 'missing data file {t}/data/ptb/train.txt'),
  'empty data file': (_data(b''), 'data file {t}/data/ptb/train.txt is empty'),
  'binary data file': (_data(b'\x00\xff\xfe garbage'), 'is not UTF-8 text'),
  'truncated data file': (
    _data(b'the company said it \nwill', **{'data.train_tokens': 0}),
    'data.bptt=10 is longer than each of the data.batch_size=4 rows '
    'the training split is cut into (2 steps)',
  ),
  'init_from a non-workdir': (
    _train(**{'train.init_from': '/nonexistent'}),
    'train.init_from=/nonexistent is not a work directory',
  ),
  'resume with other shapes': (
    lambda d, t, w: (
      lambda: train_and_evaluate(_config(d, **{'model.hidden_size': 24, 'train.max_steps': 20}), w)
    ),
    'holds a run with a different model.hidden_size (16 there, 24 now)',
  ),
  'corrupt checkpoint file': (
    _garble_latest_meta,
    'checkpoints/10 is corrupt or truncated: unreadable JSON in {w}/checkpoints/10/meta/metadata',
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
  'unknown pruner': (
    _tune(**{'study.pruner': 'asha'}),
    "tune.study.pruner='asha' is not known: choose one of median",
  ),
  'inverted tuning range': (
    _tune(**{'space.learning_rate.low': 0.1}),
    'tune.space.learning_rate: low 0.1 is above high 0.01',
  ),
  'tuned field that does not exist': (
    _tune(**{'space.learning_rate.field': 'optimizer.lr'}),
    'tune.space.learning_rate sets optimizer.lr, which is not a config field',
  ),
  'dyneval tuning without a model': (
    _tune(kind='dyneval'),
    'tune.dyneval.workdir must name a trained',
  ),
  'unknown dynamic evaluation': (
    lambda d, t, w: lambda: evaluate_workdir(w, _evaluation('dynamic', **{'dynamic.rule': 'adam'})),
    "unknown dynamic.rule 'adam'",
  ),
}


@pytest.mark.parametrize('case', CASES)
def test_bad_input_is_one_clear_error_line(case, data_dir, trained, tmp_path, capsys, caplog):
  set_up, expected = CASES[case]
  workdir = _copy(trained, tmp_path)
  job = set_up(data_dir, tmp_path, workdir)
  with pytest.raises(SystemExit) as stopped:
    cli.run(job)
  assert stopped.value.code == 1
  err = capsys.readouterr().err
  assert err.startswith('error: ') and 'Traceback' not in err
  assert expected.format(t=tmp_path, w=workdir) in err


def test_a_truncated_standard_data_file_is_named_in_a_warning(data_dir, tmp_path, caplog):
  folder = _data_folder(tmp_path, data_dir, (data_dir / 'ptb' / 'train.txt').read_bytes()[:5000])
  with caplog.at_level(logging.WARNING, 'lm_zoo'):
    load_corpus('ptb', folder)
    load_corpus('ptb', folder)  # hashed once per process
  assert caplog.text.count('differs from the standard') == 1
  assert f'data file {folder}/ptb/train.txt differs from the standard ptb file' in caplog.text


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
