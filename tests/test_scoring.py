"""A run's final evaluation is the evaluator its config's evaluation section
names, each split at its own batch size."""

import math

import pytest

from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import EvalResult, Static, TunedTemperature, perplexity
from lm_zoo.runs import load_trained, read_metrics
from lm_zoo.training import train_and_evaluate


def test_the_final_evaluation_runs_the_configured_evaluator(tiny_config, tmp_path):
  tiny_config.train.num_epochs = 1
  tiny_config.evaluation.evaluator = 'temperature'
  summary = train_and_evaluate(tiny_config, tmp_path)
  config, corpus, model, params = load_trained(tmp_path)
  for split, batch_size in (
    ('valid', config.data.eval_batch_size),
    ('test', config.data.test_batch_size),
  ):
    expected = TunedTemperature(Static(config.data.bptt, batch_size))(model, params, corpus, split)
    assert summary[split]['temperature'] == expected.temperature != 1.0
    assert summary[split]['loss'] == pytest.approx(expected.loss, rel=1e-6)
  finals = [r for r in read_metrics(tmp_path / 'metrics.jsonl') if r.get('final')]
  assert [r['kind'] for r in finals] == ['valid', 'test']
  assert finals[1]['temperature'] == summary['test']['temperature']


def test_splits_and_a_bad_evaluation_are_checked_before_training(tiny_config, tmp_path):
  tiny_config.evaluation.splits = ('test',)
  tiny_config.train.max_steps = 3
  assert 'valid' not in train_and_evaluate(tiny_config, tmp_path / 'a')
  tiny_config.evaluation.evaluator = 'learned'
  with pytest.raises(ConfigError, match='evaluation.evaluator'):
    train_and_evaluate(tiny_config, tmp_path / 'b')
  tiny_config.evaluation.update(evaluator='mc_dropout')
  tiny_config.evaluation.mc_dropout.samples = 0
  with pytest.raises(ConfigError, match='mc_dropout.samples must be a whole number >= 1'):
    train_and_evaluate(tiny_config, tmp_path / 'c')
  assert not (tmp_path / 'b' / 'checkpoints').exists()


def test_a_finite_loss_past_the_float_range_scores_an_infinite_perplexity(tiny_config, tmp_path):
  """SGD at lr 1e30 keeps the loss finite (the non-finite guard never fires)
  but past 709 nats, where exp overflows: the run ends with its scores."""
  tiny_config.train.num_epochs = 1
  tiny_config.optimizer.update(learning_rate=1e30, clip_norm=0.0)
  summary = train_and_evaluate(tiny_config, tmp_path)
  assert 709.8 < summary['valid']['loss'] < math.inf
  assert summary['valid']['perplexity'] == math.inf
  assert 'perplexity inf' in EvalResult(summary['test']['loss'], 1).summary()
  assert EvalResult(709.0, 1).perplexity == pytest.approx(math.exp(709.0))
  # The training records too: inf, not exp of a capped loss (1e304 at 700).
  trained = [r for r in read_metrics(tmp_path / 'metrics.jsonl') if r['kind'] == 'train']
  assert trained and all(r['perplexity'] == perplexity(r['loss']) for r in trained)
  assert any(r['loss'] > 709.8 and r['perplexity'] == math.inf for r in trained)
  assert math.isnan(perplexity(math.nan))
