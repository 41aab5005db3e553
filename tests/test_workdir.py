"""A run's work directory: its saved config, and which configs may resume it."""

import json

import pytest

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.training.workdir import (SHAPE_FIELDS, check_resumable, initial_params,
                                     load_config, save_config)


def test_config_of_an_older_run_loads_over_defaults(tmp_path):
  (tmp_path / 'config.json').write_text(json.dumps({'data': {'bptt': 20},
                                                    'model': {'hidden_size': 64}}))
  config = load_config(tmp_path)
  assert (config.data.bptt, config.model.hidden_size) == (20, 64)
  assert config.model.mogrifier.rounds == 0  # a field the old run did not know
  with pytest.raises(ConfigError, match='not found'):
    load_config(tmp_path / 'elsewhere')


def test_a_truncated_config_is_named(tmp_path):
  (tmp_path / 'config.json').write_text('{"data": {"bptt": 2')
  with pytest.raises(ConfigError, match='corrupt or truncated'):
    load_config(tmp_path)


def test_saved_config_round_trips(tmp_path):
  config = base_config()
  config.model.update(hidden_size=37, mogrifier={'rounds': 3, 'rank': 5})
  save_config(config, tmp_path)
  assert load_config(tmp_path).to_dict() == config.to_dict()


@pytest.mark.parametrize('field, value', [('model.hidden_size', 24),
                                          ('model.mogrifier.rounds', 2),
                                          ('data.batch_size', 7)])
def test_only_a_shape_field_change_refuses_to_resume(tmp_path, field, value):
  config = base_config()
  save_config(config, tmp_path)
  unchanged_shapes = base_config()
  unchanged_shapes.optimizer.learning_rate = 0.123  # not a shape: resumes
  unchanged_shapes.data.bptt = 7
  check_resumable(unchanged_shapes, tmp_path)
  changed = base_config()
  section, *path, name = field.split('.')
  target = changed[section]
  for part in path:
    target = target[part]
  target[name] = value
  # The error names the top-level shape field (model.mogrifier for its rounds).
  named = next(f for f in SHAPE_FIELDS if field.startswith(f))
  with pytest.raises(ConfigError, match=f'different {named} '):
    check_resumable(changed, tmp_path)


def test_init_from_a_directory_without_a_run_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match='not a work directory'):
    initial_params(tmp_path, like=None)
  save_config(base_config(), tmp_path)
  with pytest.raises(ConfigError, match='no best checkpoint'):
    initial_params(tmp_path, like=None)
