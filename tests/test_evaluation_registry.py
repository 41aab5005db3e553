"""Evaluators chosen by name: the enum of the built-in ones, each its
string, and every one built from its own section of the evaluation config."""

import pytest

from lm_zoo.configs import evaluation_config
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import EvaluatorName, MetaLearner, build_evaluator
from lm_zoo.evaluation.registry import REGISTRY


@pytest.mark.parametrize('name', list(EvaluatorName), ids=str)
def test_each_builtin_name_and_its_string_build_the_same_evaluator(name):
  learner = (
    MetaLearner(transformation=None, meta_params={}, segment_length=5, initial_learning_rate=0.1)
    if name == 'learned'
    else None
  )
  built = [
    build_evaluator(evaluation_config(choice), bptt=5, batch_size=2, meta_learner=learner)
    for choice in (name, str(name))
  ]
  assert built[0] == built[1]
  assert str(name) in REGISTRY and EvaluatorName(str(name)) is name


def test_an_unknown_evaluator_lists_the_registered_names():
  with pytest.raises(ConfigError) as err:
    build_evaluator(evaluation_config('bayes'), bptt=5, batch_size=2)
  assert str(err.value).endswith(', '.join(str(name) for name in REGISTRY))
  assert [str(name) for name in EvaluatorName] == list(REGISTRY)[: len(EvaluatorName)]


def test_an_evaluator_registered_as_meta_learned_needs_a_run_s_meta_learner(monkeypatch):
  """Registered so, an evaluator of one's own is read with each run's
  meta-learner and refused where none exists yet, as 'learned' is."""
  from lm_zoo.configs import base_config
  from lm_zoo.evaluation import needs_meta_learner, register_evaluator, registry
  from lm_zoo.training.config_checks import validate_config

  monkeypatch.setattr(registry, 'REGISTRY', dict(REGISTRY))
  monkeypatch.setattr(registry, 'META_LEARNED', set(registry.META_LEARNED))
  register_evaluator('mine', REGISTRY['learned'], meta_learned=True)
  config = base_config()
  config.evaluation.evaluator = 'mine'
  assert needs_meta_learner(config.evaluation) and not needs_meta_learner(evaluation_config())
  with pytest.raises(ConfigError, match="evaluation.evaluator='mine' needs a meta-learner"):
    validate_config(config)
  register_evaluator('mine', REGISTRY['static'])  # registered again, plainly
  assert not needs_meta_learner(config.evaluation)
