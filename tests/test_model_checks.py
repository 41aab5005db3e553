"""Every check of a model config written once: `build_model` and
`validate_config` refuse each bad field with the same one-line error."""

import math

import pytest

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import HEADS, MixtureHead, Softmax, TiedSoftmax, build_model
from lm_zoo.models.checks import CHOICES, RULES
from lm_zoo.training.config_checks import validate_config

# A value that breaks each kind of rule (`RULES`' what-it-must-be texts).
BREAKS = {
  'at least 1': 0,
  '>= 0': -1,
  'in [0, 1) (a rate of 1 would drop or keep everything)': 1.0,
  "a number >= 0 (> 0 with model.init='uniform')": math.inf,
  'below 2**31': 2**31,
}
BROKEN = [
  (field, value, must_be)
  for fields, _, must_be in RULES
  for field in fields
  for value in [BREAKS[must_be]]
]


def _set(config, field, value):
  *sections, name = field.split('.')
  for section in sections:
    config = config[section]
  config[name] = value


def _both_errors(field, value):
  """The errors of build_model and of validate_config for one field set."""
  config = base_config()
  config.model.update(embed_size=8, hidden_size=8)
  _set(config.model, field, value)
  errors = []
  for check in (lambda: build_model(config.model, 20), lambda: validate_config(config)):
    with pytest.raises(ConfigError) as err:
      check()
    errors.append(str(err.value))
  return errors


@pytest.mark.parametrize('field, value, must_be', BROKEN, ids=lambda x: str(x))
def test_a_field_out_of_range_is_one_error_from_both_entries(field, value, must_be):
  built, validated = _both_errors(field, value)
  assert (
    built
    == validated
    == (f'config field model.{field}={value!r} must be {must_be} (--config.model.{field})')
  )


@pytest.mark.parametrize('field', sorted(CHOICES))
def test_an_unknown_name_lists_the_registry_from_both_entries(field):
  built, validated = _both_errors(field, 'nonesuch')
  assert built == validated
  assert built.startswith(f"config field model.{field}='nonesuch' is not known: choose one of ")
  assert built.endswith(f'{", ".join(CHOICES[field])} (--config.model.{field})')


@pytest.mark.parametrize(
  'field, value, words',
  [
    ('cap_input_gate', True, "applies to the cells lstm, mlstm, alstm, not model.cell='gru'"),
    ('recurrent_bias', True, "applies to model.cell='lstm', not model.cell='gru'"),
  ],
)
def test_a_field_the_cell_does_not_take_is_refused_by_both(field, value, words):
  config = base_config()
  config.model.update(cell='gru', **{field: value})
  built, validated = [
    _raises(check, config) for check in (lambda c: build_model(c.model, 20), validate_config)
  ]
  assert built == validated and words in built


def _raises(check, config):
  with pytest.raises(ConfigError) as err:
    check(config)
  return str(err.value)


def test_the_mixtures_section_goes_with_its_head_only():
  cfg = base_config().model
  cfg.update(embed_size=8, hidden_size=8)
  assert build_model(cfg, 20).head == Softmax(20)
  cfg.mos.components = 3
  with pytest.raises(ConfigError) as err:
    build_model(cfg, 20)
  assert str(err.value) == (
    "config field model.mos.components=3 configures the 'mos' head, but "
    "model.head='softmax': set --config.model.head=mos, or leave model.mos alone "
    '(--config.model.mos.components)'
  )
  cfg.update(head='mos', tie_embeddings=True)
  assert build_model(cfg, 20).head == MixtureHead(20, 3, tied=True)
  cfg.update(head='softmax')
  cfg.mos.components = base_config().model.mos.components
  assert build_model(cfg, 20).head == TiedSoftmax(20)


def test_every_head_builds_a_model_that_the_config_describes():
  from lm_zoo.models import describe_model

  for name, spec in HEADS.items():
    cfg = base_config().model
    cfg.update(embed_size=8, hidden_size=8, head=name)
    model = build_model(cfg, 20)
    assert model.head == spec.make(cfg, 20, None)
    assert describe_model(cfg, model).endswith(spec.describe(cfg))
