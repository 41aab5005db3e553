"""Bad fields of a training or tuning config, given on purpose: each is one
clear `error:` line naming the field and what it must be, exit status 1, and
no traceback, through `cli.run` as every program runs."""

import pytest
from refusals import refused_in_one_line, tiny_config

from lm_zoo.training import train_and_evaluate
from lm_zoo.tuning import param, run_worker, tuning_config


def _train(**fields):
  return lambda d, t: lambda: train_and_evaluate(tiny_config(d, **fields), t / 'new')


def _tune(**fields):
  """A tuning worker whose tuning config has `fields` set."""

  def set_up(d, t):
    tune = tuning_config()
    tune.base = tiny_config(d)
    tune.space.learning_rate = param('optimizer.learning_rate', 1e-3, 1e-2, log=True)
    tune.update_from_flattened_dict(fields)
    return lambda: run_worker(tune, t / 'tune')

  return set_up


# id -> (set-up(data_dir, tmp_path) -> job, what the error line says)
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
  'windows padded past BPTT': (
    _train(**{'data.variable_bptt': True, 'data.pad_windows_to': 10**6}),
    'data.pad_windows_to=1000000 is longer than data.bptt=',
  ),
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
  'init_from a non-workdir': (
    _train(**{'train.init_from': '/nonexistent'}),
    'train.init_from=/nonexistent is not a work directory',
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
}


@pytest.mark.parametrize('case', CASES)
def test_a_bad_config_field_is_one_clear_error_line(case, data_dir, tmp_path, capsys):
  set_up, expected = CASES[case]
  assert expected in refused_in_one_line(set_up(data_dir, tmp_path), capsys)
