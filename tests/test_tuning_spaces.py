"""Search spaces: the Mogrifier paper's Tables 4 to 6 read from the paper's own
text, sampling into config fields, and the embedding ratio under a budget."""

import math
import pathlib
import re

import optuna
import pytest

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import build_model
from lm_zoo.models.factory import count_params
from lm_zoo.tuning import (
  dyneval_table6,
  mogrifier_table4,
  mogrifier_table5,
  param,
  set_fields,
  suggest,
)
from lm_zoo.tuning.spaces import check_space, position

PAPER = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'papers' / 'mogrifier-lstm.txt'


def _paper_table(number: int) -> dict[str, tuple[float, float, bool]]:
  """Table `number` of the paper's appendix A: name -> (low, high, log spacing)."""
  text = PAPER.read_text()
  body = text.split(f'Table {number}:')[1].split('Low High Spacing')[1]
  body = re.split(r'Table \d+:|\n\d+ Published', body)[0]
  rows = {}
  for line in body.strip().splitlines():
    name, low, high, *spacing = re.sub(r' \(\w\)', '', line).split()
    rows[name] = (float(low), float(high.split('/')[0]), spacing == ['log'])
  return rows


def _ours(space) -> dict[str, tuple[float, float, bool]]:
  return {name: (spec.low, spec.high, spec.log) for name, spec in space.items()}


def test_the_spaces_are_the_papers_tables():
  if not PAPER.is_file():
    pytest.skip(f'{PAPER} not found')
  assert _ours(mogrifier_table4(mogrifier=True)) == _paper_table(4)
  assert _ours(mogrifier_table5(mogrifier=True)) == _paper_table(5)
  table6 = _paper_table(6)
  assert _ours(dyneval_table6('word')) == table6
  # "20/50": segments of at most 20 words or 50 characters.
  assert dyneval_table6('char').max_time_steps.high == 50
  lstm = _ours(mogrifier_table4(mogrifier=False))
  assert set(_paper_table(4)) - set(lstm) == {'mogrifier_rounds', 'mogrifier_rank'}


def test_sampled_values_land_in_their_fields_with_the_fields_types():
  space = mogrifier_table4(mogrifier=True)
  values = {
    'learning_rate': 2e-3,
    'input_embedding_ratio': 0.5,
    'l2_penalty': 1e-5,
    'input_dropout': 0.3,
    'inter_layer_dropout': 0.2,
    'state_dropout': 0.1,
    'output_dropout': 0.4,
    'mogrifier_rounds': 5,
    'mogrifier_rank': -3,
  }
  sampled = suggest(optuna.trial.FixedTrial(values), space)
  assert sampled == values
  config = set_fields(base_config(), space, sampled)
  assert config.optimizer.learning_rate == 2e-3 and config.model.embed_ratio == 0.5
  assert config.model.mogrifier.rounds == 5 and config.model.mogrifier.rank == -3
  assert isinstance(config.model.mogrifier.rank, int)
  assert base_config().optimizer.learning_rate == 1.0  # the base is left alone
  with pytest.raises(ConfigError, match='model.no_such_field'):
    set_fields(base_config(), {'x': param('model.no_such_field', 0, 1)}, {'x': 0.5})


def test_a_random_sampler_stays_inside_each_range():
  space = mogrifier_table4(mogrifier=True)
  study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
  for _ in range(50):
    trial = study.ask()
    for name, value in suggest(trial, space).items():
      spec = space[name]
      assert spec.low <= value <= spec.high
      assert isinstance(value, int) == spec.integer
    study.tell(trial, 0.0)


def test_bad_ranges_are_refused():
  with pytest.raises(ConfigError, match='empty'):
    check_space(mogrifier_table4(False).__class__())
  with pytest.raises(ConfigError, match='above high'):
    check_space({'x': param('optimizer.l2', 1.0, 0.5)})
  with pytest.raises(ConfigError, match='log-scale'):
    check_space({'x': param('optimizer.l2', 0.0, 0.5, log=True)})


def test_position_is_linear_or_logarithmic():
  assert position(0.45, param('f', 0.0, 0.9)) == pytest.approx(0.5)
  # The geometric mean sits in the middle of a log range.
  assert position(math.sqrt(1e-6 * 1e-2), param('f', 1e-6, 1e-2, log=True)) == pytest.approx(0.5)


@pytest.mark.parametrize('ratio', [0.0, 0.25, 0.5, 1.5])
def test_the_embedding_ratio_holds_under_a_parameter_budget(ratio):
  config = base_config()
  config.model.update(tie_embeddings=True, param_budget=400_000, embed_ratio=ratio)
  model = build_model(config.model, 1000)
  hidden = model.stack.cells[0].features
  # Ratios of 1 and more mean equal sizes (the paper: no projection then); 0
  # is the smallest embedding.
  assert model.embedding.features == max(1, round(min(ratio, 1.0) * hidden))
  assert count_params(model) <= 400_000
  config.model.hidden_size = hidden + 1
  config.model.param_budget = 0
  assert count_params(build_model(config.model, 1000)) > 400_000  # the largest that fits
