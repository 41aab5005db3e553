"""The robustness study: the sampled rates and a tiny study of real runs."""

import json
import math

import numpy as np
import pytest

from lm_zoo.errors import ConfigError
from lm_zoo.tasks import offset_rates, run_robustness, sample_offsets


def test_offsets_are_uniform_on_the_interval_and_seeded():
  draws = sample_offsets(('a', 'b'), 0.1, 2000, seed=3)
  values = np.array([[d['a'], d['b']] for d in draws])
  assert values.min() >= -0.1 and values.max() <= 0.1
  # Uniform on [-0.1, 0.1]: mean 0, variance 0.2² / 12; the two fields independent.
  np.testing.assert_allclose(values.mean(0), 0.0, atol=0.005)
  np.testing.assert_allclose(values.var(0), 0.04 / 12, rtol=0.1)
  assert abs(np.corrcoef(values.T)[0, 1]) < 0.1
  assert draws[:5] == sample_offsets(('a', 'b'), 0.1, 5, seed=3)
  with pytest.raises(ConfigError, match='radius'):
    sample_offsets(('a',), -0.1, 1, seed=0)


def test_rates_stay_rates():
  assert offset_rates({'a': 0.05, 'b': 0.5, 'c': 0.9}, {'a': -0.1, 'b': 0.05, 'c': 0.1}) == {
    'a': 0.0,
    'b': 0.55,
    'c': 0.95,
  }


@pytest.fixture
def study(tiny_config, tmp_path):
  import ml_collections

  tiny_config.train.num_epochs = 1
  tiny_config.generate.num_lines = 0
  diverging = ml_collections.ConfigDict(tiny_config.to_dict())
  diverging.optimizer.learning_rate = 1e38  # a valid config whose loss overflows
  c = ml_collections.ConfigDict()
  c.models = ml_collections.ConfigDict({'lstm': tiny_config, 'broken': diverging})
  c.rates = ('dropout_input', 'dropout_state')
  c.radius = 0.1
  c.num_samples = 2
  c.seed = 0
  c.workdir = str(tmp_path / 'study')
  return c


def test_study_pairs_draws_counts_divergence_and_resumes(study, tmp_path):
  rows = run_robustness(study)
  assert [(r['model'], r['sample']) for r in rows] == [
    ('broken', 0),
    ('lstm', 0),
    ('broken', 1),
    ('lstm', 1),
  ]
  offsets = sample_offsets(study.rates, 0.1, 2, seed=0)
  for row in rows:  # both models of a sample share the draw
    assert {f: row[f] for f in study.rates} == offset_rates(
      study.models.lstm.model, offsets[row['sample']]
    )
  lstm_rows = [r for r in rows if r['model'] == 'lstm']
  assert all(math.isfinite(r['valid_perplexity']) for r in lstm_rows)
  assert all(r['valid_perplexity'] == math.inf for r in rows if r['model'] == 'broken')
  summary = json.loads((tmp_path / 'study' / 'lstm_1' / 'summary.json').read_text())
  assert summary['valid']['perplexity'] == lstm_rows[1]['valid_perplexity']
  # A second call reads finished runs back instead of training them again.
  summary['valid']['perplexity'] = 1.5
  (tmp_path / 'study' / 'lstm_1' / 'summary.json').write_text(json.dumps(summary))
  assert run_robustness(study)[3]['valid_perplexity'] == 1.5


def test_unknown_rate_is_named(study):
  study.rates = ('dropout_input', 'dropout_nowhere')
  with pytest.raises(ConfigError, match='dropout_nowhere'):
    run_robustness(study)


def test_experiment_compares_models_at_one_budget_and_one_centre():
  from conftest import load_experiment

  config = load_experiment('alstm_robustness')
  lstm, alstm = config.models.lstm.model, config.models.alstm.model
  assert (lstm.cell, alstm.cell, alstm.alstm.latent) == ('lstm', 'alstm', 'lstm')
  assert lstm.param_budget == alstm.param_budget > 0
  assert {f: lstm[f] for f in config.rates} == {f: alstm[f] for f in config.rates}
