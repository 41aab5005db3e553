"""The evaluators' settings refused where they are made, naming the
attribute (lm_zoo.evaluation.checks), and from a config, naming its field
(the registry)."""

import math

import pytest

from lm_zoo.configs import evaluation_config
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import Dynamic, MCDropout, Static, TunedTemperature, build_evaluator


@pytest.mark.parametrize(
  'evaluator, field, value, message',
  [
    ('bayes', 'evaluator', 'bayes', 'unknown evaluator'),
    ('static', 'static.temperature', float('nan'), 'static.temperature must be a positive'),
    ('static', 'static.temperature', -1.0, 'static.temperature must be a positive'),
    ('mc_dropout', 'mc_dropout.samples', -2, 'mc_dropout.samples must be a whole number >= 1'),
    ('dynamic', 'dynamic.rule', 'adam', "dynamic.rule 'adam' is unknown"),
    ('dynamic', 'dynamic.learning_rate', (float('nan'),), 'dynamic.learning_rate must be'),
    ('dynamic', 'dynamic.decay_mean', 'rows', 'dynamic.decay_mean must be one of'),
    ('dynamic', 'dynamic.segment_length', (0,), 'dynamic.segment_length must be whole numbers'),
    ('dynamic', 'dynamic.segment_length', (5, 2.5), r'must be whole numbers >= 1, got \(5, 2.5\)'),
    ('dynamic', 'dynamic.members', -1, 'dynamic.members must be a whole number >= 0'),
    ('dynamic_rms', 'dynamic.eps', (1e-3, 0.0), "dynamic.eps must be > 0 for rule 'rms'"),
    ('static', 'max_tokens', -5, 'max_tokens must be a whole number >= 0'),
    (
      'static',
      'splits',
      ('valid', 1),
      r"splits must be a tuple of split names, got \('valid', 1\)",
    ),
    ('temperature', 'temperature.low', 3.0, 'need 0 < low < high'),
    ('temperature', 'temperature.high', float('inf'), r'need 0 < low < high \(finite\)'),
    ('temperature', 'temperature.tolerance', 1.5, 'tolerance < high - low'),
  ],
)
def test_bad_settings_are_refused_naming_the_field(evaluator, field, value, message):
  config = evaluation_config(evaluator.removesuffix('_rms'))
  if evaluator == 'dynamic_rms':
    config.dynamic.rule = 'rms'
  section, _, name = field.rpartition('.')
  (config[section] if section else config)[name] = value
  with pytest.raises(ConfigError, match=message):
    build_evaluator(config, bptt=5, batch_size=1)


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: Static(10, 2, temperature=-1.0), 'temperature must be a positive number, got -1.0'),
    (lambda: Static(10, 2, temperature=0), 'temperature must be a positive number, got 0'),
    (lambda: Static(10, max_tokens=-5), 'max_tokens must be a whole number >= 0'),
    (lambda: Static(0), 'bptt must be a whole number >= 1, got 0'),
    (lambda: MCDropout(10, samples=2.0), 'samples must be a whole number >= 1, got 2.0'),
    (lambda: MCDropout(10, dropout_scale=math.inf), 'dropout_scale must be >= 0, got inf'),
    (lambda: TunedTemperature(Static(5), tolerance=math.inf), 'tolerance < high - low'),
    (
      lambda: TunedTemperature('static'),
      "base must be a Static or MCDropout evaluator, got 'static'",
    ),
    (lambda: Dynamic(10, learning_rate=(-1.0,)), r'learning_rate must be one or more numbers >= 0'),
    (
      lambda: Dynamic(10, learning_rate=0.1),
      'learning_rate must be one or more numbers >= 0, got 0.1',
    ),
    (lambda: Dynamic(10, rule='adam'), "rule 'adam' is unknown: choose one of sgd, rms"),
    (lambda: Dynamic(10, segment_length=(2.5,)), 'segment_length must be whole numbers >= 1'),
    (lambda: Dynamic(10, search_tokens=-5), 'search_tokens must be a whole number >= 0'),
    (lambda: Dynamic(10, rule='rms', eps=(0.0,)), "eps must be > 0 for rule 'rms'"),
  ],
)
def test_an_evaluator_made_in_python_refuses_settings_it_cannot_score_with(make, message):
  with pytest.raises(ConfigError, match=message):
    make()
