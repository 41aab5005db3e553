"""Finished work directories: scoring them by evaluation configs, and the
meta-learned rule trained for them and stored beside them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.configs import evaluation_config, meta_training_config
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import Static
from lm_zoo.optim import PRECISION_FLOOR, dynamic_rms
from lm_zoo.runs import load_trained
from lm_zoo.training import evaluate_workdir, evaluate_workdirs, meta_train_workdir
from lm_zoo.training.meta_learner import META_LEARNER_DIR, load_meta_learner


def _flat_params(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


def test_evaluate_workdir_is_the_evaluator_on_the_best_weights(trained_workdir):
  config, corpus, model, params = load_trained(trained_workdir)
  results = evaluate_workdir(trained_workdir)
  assert list(results) == ['valid', 'test']
  static = Static(config.data.bptt, config.data.test_batch_size)
  for split, result in results.items():
    assert result.loss == static(model, params, corpus, split).loss
  one = evaluation_config()
  one.splits = ('test,valid',)  # as a command line gives it
  assert list(evaluate_workdir(trained_workdir, one)) == ['test', 'valid']


@pytest.mark.parametrize(
  'workdirs, config, message',
  [
    ('runs/x', None, r'workdirs is one work directory \(runs/x\), not a list of them'),
    (['runs/x', None], None, 'workdirs must name work directories'),
    (['runs/x'], {'evaluator': 'static'}, 'config must be an evaluation config'),
    (['runs/x'], 'NO_SPLITS', 'splits is empty'),
  ],
)
def test_scoring_workdirs_refuses_what_it_cannot_score_before_loading(workdirs, config, message):
  if config == 'NO_SPLITS':
    config = evaluation_config()
    config.splits = ()
  with pytest.raises(ConfigError, match=message):
    evaluate_workdirs(workdirs, config)


def test_workdirs_scored_together_are_each_as_alone(trained_workdir, tmp_path, data_dir):
  """Two seeds of one model and a run of another size: dynamic evaluation
  searches and scores the seeds in shared scans and the other model on its
  own; every run's scores are its `evaluate_workdir`'s."""
  from conftest import tiny_lm_config

  from lm_zoo.evaluation.dynamic import _scan_members
  from lm_zoo.training import train_and_evaluate

  others = []
  for seed, hidden in ((1, 16), (0, 12)):
    config = tiny_lm_config(data_dir)
    config.update(seed=seed)
    config.train.num_epochs = 1
    config.model.hidden_size = hidden
    train_and_evaluate(config, tmp_path / f'run{len(others)}')
    others.append(tmp_path / f'run{len(others)}')
  config = evaluation_config('dynamic')
  config.dynamic.update(rule='rms', learning_rate=(1e-3, 1e-2), ms_batches=2, ms_batch_size=2)
  config.dynamic.members = 0
  workdirs = [trained_workdir, *others]
  _scan_members.clear_cache()
  together = evaluate_workdirs(workdirs, config)
  # The seeds' search (4 runs) and test (2); the other model's search (2).
  assert _scan_members._cache_size() == 3
  config.dynamic.members = 1
  for results, workdir in zip(together, workdirs):
    alone = evaluate_workdir(workdir, config)
    assert list(results) == list(alone) == ['valid', 'test']
    for split, result in results.items():
      assert result.details['settings'] == alone[split].details['settings']
      np.testing.assert_allclose(result.loss, alone[split].loss, rtol=1e-5)
  static = evaluate_workdirs(workdirs)
  assert [r['test'].loss for r in static] == [evaluate_workdir(w)['test'].loss for w in workdirs]


def _meta_train(workdir, **fields):
  config = meta_training_config()
  defaults = dict(
    meta_steps=0,
    prior='rms',
    initial_learning_rate=1e-2,
    initial_decay=0.5,
    initial_eps=1e-3,
    fisher_batches=2,
    fisher_batch_size=2,
    hidden=4,
  )
  config.update({**defaults, **fields})
  meta_train_workdir(workdir, config)


@pytest.mark.parametrize(
  'fields, message',
  [
    (dict(hidden=True), 'hidden must be a whole number >= 1, got True'),
    (dict(segment_length=True), 'segment_length must be a whole number >= 1, got True'),
  ],
)
def test_a_meta_training_size_that_is_no_whole_number_is_refused(trained_workdir, fields, message):
  with pytest.raises(ConfigError, match=message):
    _meta_train(trained_workdir, **fields)


@pytest.fixture(scope='module')
def workdir_rule(trained_workdir, tmp_path_factory):
  """The trained work directory's RMS-prior meta-learner (decay_mean
  'coordinates', the default) saved in a folder of its own: its path."""
  folder = tmp_path_factory.mktemp('rule') / 'rule'
  _meta_train(trained_workdir, output=str(folder))
  return folder


def _learned_and_rms_updates(folder):
  """One update of the meta-learner saved in `folder`, and the RMS rule's
  ingredients: its ms and the arguments of the update."""
  learned = load_meta_learner(folder)
  precision = learned.transformation.init(None).precision  # the model's Fisher, saved
  params = jax.tree.map(lambda x: jnp.linspace(-1.0, 1.0, x.size).reshape(x.shape), precision)
  trained = jax.tree.map(lambda p: p + 0.01, params)
  grads = jax.tree.map(lambda p: jnp.cos(3.0 * p), params)
  updates, _ = learned.transformation.update(
    grads, learned.transformation.init(trained), params, loss=4.0, meta_params=learned.meta_params
  )
  # The rule's ms: weights no gradient reached have a floor, not 0.
  ms = jax.tree.map(lambda x: jnp.sqrt(x + PRECISION_FLOOR), precision)
  return updates, ms, params, trained, grads


@pytest.mark.parametrize('decay_mean', ['coordinates', 'tensors'])
def test_a_saved_rms_prior_meta_learner_loads_as_the_rms_rule_it_started_as(
  trained_workdir, decay_mean, request
):
  if decay_mean == 'coordinates':  # the default, saved in a folder of its own
    folder = request.getfixturevalue('workdir_rule')
  else:  # saved where the work directory keeps it
    _meta_train(trained_workdir, decay_mean=decay_mean)
    folder = trained_workdir / META_LEARNER_DIR
  updates, ms, params, trained, grads = _learned_and_rms_updates(folder)
  rms = dynamic_rms(1e-2, 0.5, 1e-3, ms, decay_mean)
  expected, _ = rms.update(grads, rms.init(trained), params)
  np.testing.assert_allclose(_flat_params(updates), _flat_params(expected), rtol=1e-4, atol=1e-6)


def test_a_preset_is_meta_trained_into_a_named_folder_and_stays_as_exported(
  trained_workdir, workdir_rule, tmp_path
):
  from lm_zoo.errors import ConfigError
  from lm_zoo.presets import verify
  from lm_zoo.runs import export

  preset = export(trained_workdir, tmp_path / 'preset')
  files = sorted(p.name for p in preset.iterdir())
  with pytest.raises(ConfigError, match=r'is a preset.*--config.output=FOLDER'):
    _meta_train(preset)
  _meta_train(preset, output=str(tmp_path / 'rule'))
  assert sorted(p.name for p in preset.iterdir()) == files
  verify(preset)  # every file as exported
  saved = load_meta_learner(tmp_path / 'rule')
  from_workdir = load_meta_learner(workdir_rule)
  # The same weights and data: the same Fisher precision in both rules.
  np.testing.assert_array_equal(
    _flat_params(saved.transformation.init(None).precision),
    _flat_params(from_workdir.transformation.init(None).precision),
  )
  config = evaluation_config('learned')
  config.splits = ('valid',)
  config.learned.meta_learner = str(tmp_path / 'rule')
  assert (
    evaluate_workdir(preset, config)['valid'].loss
    == evaluate_workdir(trained_workdir, config)['valid'].loss
  )
