"""Evaluators built from evaluation configs, each held against the function
it is made of run by hand, or against a property its scores must have."""

import dataclasses

import jax
import numpy as np
import pytest
from conftest import perturb

from lm_zoo.cells import LSTMCell
from lm_zoo.configs import evaluation_config
from lm_zoo.data import Corpus
from lm_zoo.data.vocab import Vocab
from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.evaluation import (
  Dynamic,
  DynamicEvalSettings,
  DynamicRuleSpec,
  MCDropout,
  MetaLearner,
  Prepared,
  Static,
  TunedTemperature,
  build_evaluator,
  dynamic_evaluate,
  token_losses,
  tune_temperature,
)
from lm_zoo.evaluation.dynamic import _scan_segments
from lm_zoo.evaluation.streams import make_eval_step
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.optim import GateNetwork, dynamic_rms, dynamic_sgd, learned_update_rule

V = 11
_rng = np.random.default_rng(0)
CORPUS = Corpus(
  'toy',
  Vocab(tuple(f'w{i}' for i in range(V))),
  *(_rng.integers(0, V, n).astype(np.int32) for n in (301, 121, 91)),
  'word',
)


@pytest.fixture(scope='module')
def lm():
  model = RecurrentLM(Embedding(V, 6), Stack([LSTMCell(7)], dropout_output=0.3), Softmax(V))
  return model, perturb(init_params(model, jax.random.key(0)))


def _nll(model, params, stream):
  """Mean NLL of stream[1:] in one pass from a zero state, the log-softmax in NumPy."""
  logits, _ = model.apply({'params': params}, stream[None, :-1], model.initialize_carry(1))
  z = np.asarray(logits[0], np.float64)
  z = z - z.max(-1, keepdims=True)
  log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -log_probs[np.arange(len(stream) - 1), stream[1:]].mean()


def test_static_scores_the_first_max_tokens_as_one_pass(lm):
  model, params = lm
  result = Static(bptt=7, batch_size=1, max_tokens=50)(model, params, CORPUS, 'valid')
  assert result.num_tokens == 50
  np.testing.assert_allclose(result.loss, _nll(model, params, CORPUS.valid[:51]), rtol=1e-5)
  whole = Static(bptt=7, batch_size=3)(model, params, CORPUS, 'test')
  assert whole.num_tokens == len(CORPUS.test) - 1


def test_static_scores_several_weights_in_one_pass_each_as_alone(lm):
  """`members` weights a vmapped pass (0: all; 2 of 3: a pair, then one),
  one compiled step a number of weights: each loss that of its own pass, at
  the evaluator's temperature."""
  model, params = lm
  weights = [params, perturb(params, seed=5, scale=0.1), perturb(params, seed=6, scale=0.1)]
  prepared = [Prepared(model, w, CORPUS) for w in weights]
  alone = Static(bptt=9, batch_size=2, temperature=1.3, max_tokens=60)
  expected = [alone.score(p, 'test') for p in prepared]
  assert len({r.loss for r in expected}) == 3
  stacked_step = make_eval_step(model, stacked=True)
  compiled = stacked_step._cache_size()
  for members, programs in ((0, 1), (2, 2)):  # 3 weights at once; a pair, then one
    results = dataclasses.replace(alone, members=members).score_many(prepared, 'test')
    np.testing.assert_allclose([r.loss for r in results], [r.loss for r in expected], rtol=1e-6)
    assert [(r.num_tokens, r.temperature) for r in results] == [(60, 1.3)] * 3
    assert stacked_step._cache_size() == compiled + programs
    compiled += programs
  other = RecurrentLM(Embedding(V, 6), Stack([LSTMCell(5)]), Softmax(V))
  mixed = [prepared[0], Prepared(other, init_params(other, jax.random.key(1)), CORPUS)]
  with pytest.raises(ValueError, match='one model and one corpus'):
    dataclasses.replace(alone, members=0).score_many(mixed, 'test')
  for members in (-1, 1.5, True):
    with pytest.raises(ValueError, match='members must be a whole number'):
      dataclasses.replace(alone, members=members).score_many(prepared, 'test')


def test_mc_dropout_at_scale_zero_is_static_evaluation(lm):
  model, params = lm
  static = Static(bptt=9, batch_size=2)(model, params, CORPUS, 'valid')
  mc = MCDropout(bptt=9, batch_size=2, samples=3, dropout_scale=0.0)(model, params, CORPUS, 'valid')
  np.testing.assert_allclose(mc.loss, static.loss, rtol=1e-5)
  dropped = MCDropout(bptt=9, batch_size=2, samples=3)(model, params, CORPUS, 'valid')
  assert dropped.loss != pytest.approx(static.loss, rel=1e-5)


def test_a_tuned_temperature_is_tuned_once_on_valid_and_used_on_every_split(lm, monkeypatch):
  model, params = lm
  base = Static(bptt=9, batch_size=1)
  expected = tune_temperature(
    lambda t: dataclasses.replace(base, temperature=t)(model, params, CORPUS, 'valid').loss
  )
  calls = []
  evaluator = TunedTemperature(base)
  original = Static.score
  monkeypatch.setattr(
    Static,
    'score',
    lambda self, prepared, split: calls.append(split) or original(self, prepared, split),
  )
  prepared = evaluator.prepare(model, params, CORPUS)
  assert prepared.choice == expected
  results = {split: evaluator.score(prepared, split) for split in ('valid', 'test')}
  assert results['test'].temperature == results['valid'].temperature == expected
  assert calls.count('test') == 1 and calls.count('valid') == len(calls) - 1
  np.testing.assert_allclose(
    results['test'].loss,
    dataclasses.replace(base, temperature=expected)(model, params, CORPUS, 'test').loss,
  )


def test_dynamic_searches_valid_and_scores_each_split_with_the_best_setting(lm):
  model, params = lm
  evaluator = Dynamic(
    bptt=9, rule='sgd', learning_rate=(0.0, 0.3, 30.0), decay=(0.0,), segment_length=(4,)
  )
  prepared = evaluator.prepare(model, params, CORPUS)
  test = evaluator.score(prepared, 'test')
  losses = {
    lr: loss for settings, loss in test.details['search'] for lr in [settings['learning_rate']]
  }
  fresh = {
    lr: dynamic_evaluate(model, params, dynamic_sgd(lr), CORPUS.valid, 4).result.loss
    for lr in (0.0, 0.3)
  }
  for lr, loss in fresh.items():
    np.testing.assert_allclose(losses[lr], loss, rtol=1e-5)
  best = min(losses, key=losses.get)
  assert test.details['settings']['learning_rate'] == best
  np.testing.assert_allclose(
    test.loss,
    dynamic_evaluate(model, params, dynamic_sgd(best), CORPUS.test, 4).result.loss,
    rtol=1e-5,
  )
  assert test.details['segment_tokens'].sum() == test.num_tokens == len(CORPUS.test) - 1
  # The search scored the whole of valid: valid's result is the search's.
  assert evaluator.score(prepared, 'valid').loss == pytest.approx(losses[best])


@pytest.mark.parametrize('rule', ['sgd', 'rms'])
def test_weights_searched_and_scored_together_are_each_as_alone(lm, rule):
  """Two weights (each with its own MS) searched and scored with every run
  in one scan (`members=0`): each one's search, choice and scores are those
  of its own evaluation one run at a time; a weights whose every setting
  diverges is its own error."""
  model, params = lm
  weights = [params, perturb(params, seed=5, scale=0.1)]
  searched = dict(learning_rate=(1e-3, 3e-2), decay=(0.0, 0.1), segment_length=(4, 6))
  one_by_one = Dynamic(bptt=9, rule=rule, ms_batches=2, ms_batch_size=2, **searched)
  together = dataclasses.replace(one_by_one, members=0)
  prepared = together.prepare_many(model, weights, CORPUS)
  scored = together.score_many(prepared, 'test')
  for start, choice, result in zip(weights, prepared, scored):
    alone = one_by_one.prepare(model, start, CORPUS)
    assert choice.choice.settings == alone.choice.settings
    np.testing.assert_allclose(
      [loss for _, loss in choice.choice.trials],
      [loss for _, loss in alone.choice.trials],
      rtol=1e-5,
    )
    by_itself = one_by_one.score(alone, 'test')
    np.testing.assert_allclose(result.loss, by_itself.loss, rtol=1e-5)
    assert result.details['static_loss'] == by_itself.details['static_loss']
  assert scored[0].loss != pytest.approx(scored[1].loss, rel=1e-4)

  blown = {**params, 'head': {**params['head'], 'bias': params['head']['bias'] * 1e30}}
  search = dataclasses.replace(together, decay=(0.0,), segment_length=(4,))
  outcomes = search.prepare_many(model, [blown, params], CORPUS)
  assert isinstance(outcomes[0], TrainingError) and 'every searched setting' in str(outcomes[0])
  assert isinstance(outcomes[1], Prepared)
  # prepare_many's list scores as it is: the error stays in its place.
  error, result = search.score_many(outcomes, 'test')
  assert error is outcomes[0]
  np.testing.assert_allclose(result.loss, search.score(outcomes[1], 'test').loss, rtol=1e-6)
  one_setting = dataclasses.replace(search, learning_rate=(1e-3,))
  finished = one_setting.score_many(
    one_setting.prepare_many(model, [blown, params], CORPUS), 'test'
  )
  assert isinstance(finished[0], TrainingError) and 'diverged' in str(finished[0])
  assert finished[1].loss == pytest.approx(
    one_setting(model, params, CORPUS, 'test').loss, rel=1e-5
  )
  with pytest.raises(ValueError, match='members must be a whole number >= 0'):
    dataclasses.replace(search, members=-1).prepare(model, params, CORPUS)


def test_evaluators_score_many_weights_as_each_alone(lm):
  model, params = lm
  weights = [params, perturb(params, seed=6, scale=0.1)]
  evaluator = MCDropout(bptt=9, samples=3, max_tokens=40)
  scored = evaluator.score_many(evaluator.prepare_many(model, weights, CORPUS), 'test')
  assert [r.loss for r in scored] == [evaluator(model, w, CORPUS, 'test').loss for w in weights]


def test_what_one_set_of_weights_prepared_does_not_touch_another_s(lm):
  """Evaluators keep nothing between weights: each prepared value holds
  its own choice, and scoring one after preparing another gives what it
  gave before."""
  model, params = lm
  # Logits log(count) of the words valid scores: the tuned temperature is 1
  # (that unigram is the maximum-likelihood one), and 1/3 for a third of them.
  counts = np.bincount(CORPUS.valid[1:], minlength=V)
  assert counts.min() > 0
  log_counts = np.log(counts).astype(np.float32)
  unigram = lambda scale: {
    **params,
    'head': {'kernel': 0 * params['head']['kernel'], 'bias': scale * log_counts},
  }
  params, other = unigram(1.0), unigram(1 / 3)
  evaluator = TunedTemperature(Static(bptt=9, batch_size=1), low=0.1, high=4.0)
  first = evaluator.prepare(model, params, CORPUS)
  before = evaluator.score(first, 'test').loss
  second = evaluator.prepare(model, other, CORPUS)
  assert first.choice == pytest.approx(1.0, abs=0.02)
  assert second.choice == pytest.approx(1 / 3, abs=0.01)
  assert evaluator.score(first, 'test').loss == before
  assert evaluator.score(second, 'test').loss == evaluator(model, other, CORPUS, 'test').loss
  assert evaluator == TunedTemperature(Static(bptt=9, batch_size=1), low=0.1, high=4.0)


def test_learning_rate_zero_is_the_static_score_at_batch_one(lm):
  model, params = lm
  dynamic = Dynamic(bptt=9, learning_rate=(0.0,), segment_length=(5,), max_tokens=60)
  static = Static(bptt=9, batch_size=1, max_tokens=60)
  result = dynamic(model, params, CORPUS, 'test')
  np.testing.assert_allclose(result.loss, static(model, params, CORPUS, 'test').loss, rtol=1e-5)
  # The static score of the same tokens travels with every dynamic result.
  assert result.details['static_loss'] == static(model, params, CORPUS, 'test').loss
  assert DynamicEvalSettings(**result.details['settings']).used() == {
    'rule': 'sgd',
    'learning_rate': 0.0,
    'decay': 0.0,
    'segment_length': 5,
  }


def test_settings_share_one_compiled_scan(lm):
  """RMS settings scored by one evaluator equal fresh transformations', and
  compile once, whatever the kind of mean(MS) (kept in the state), where
  fresh ones, which hold their settings as constants, compile each time."""
  model, params = lm
  evaluator = Dynamic(bptt=9, rule='rms', ms_batches=2, ms_batch_size=2)
  setup = evaluator.setup(model, params, CORPUS)
  ms = setup.rms_gradients
  _scan_segments.clear_cache()  # other tests' scans of this model would be found
  compiled = _scan_segments._cache_size()
  for lr, decay, eps, mean in (
    (1e-3, 1e-2, 1e-3, 'tensors'),
    (3e-2, 1e-1, 1e-2, 'tensors'),
    (1e-2, 1e-2, 1e-3, 'coordinates'),
  ):
    shared = evaluator.score_settings(
      setup, DynamicEvalSettings('rms', lr, decay, eps, 4, mean), model, params, CORPUS, 'valid'
    )
    fresh = dynamic_evaluate(model, params, dynamic_rms(lr, decay, eps, ms, mean), CORPUS.valid, 4)
    np.testing.assert_allclose(shared.details['segment_nll'], fresh.segment_nll, rtol=1e-5)
  assert _scan_segments._cache_size() - compiled == 1 + 3


def test_the_learned_evaluator_runs_the_rule_at_its_segment_length(lm):
  model, params = lm
  net = GateNetwork(hidden=3, learning_rate=0.05)
  meta_params = net.init(jax.random.key(1), np.zeros((1, 5), np.float32))
  rule = learned_update_rule(net.apply)
  learned = MetaLearner(rule, meta_params, segment_length=3, initial_learning_rate=0.05)
  config = evaluation_config('learned')
  config.max_tokens = 40
  result = build_evaluator(config, bptt=9, batch_size=1, meta_learner=learned)(
    model, params, CORPUS, 'valid'
  )
  by_hand = dynamic_evaluate(
    model, params, rule, CORPUS.valid[:41], 3, extra_args={'meta_params': meta_params}
  )
  np.testing.assert_allclose(result.loss, by_hand.result.loss, rtol=1e-6)
  assert result.details['settings']['segment_length'] == 3


def test_token_losses_are_the_per_token_losses_and_their_mean(lm):
  model, params = lm
  config = evaluation_config('token_losses')
  result = build_evaluator(config, bptt=8, batch_size=4)(model, params, CORPUS, 'test')
  expected = token_losses(model, params, CORPUS.test, 8)
  np.testing.assert_allclose(result.details['token_losses'], expected)
  np.testing.assert_allclose(result.loss, _nll(model, params, CORPUS.test), rtol=1e-5)


def test_a_split_shorter_than_a_batchs_rows_names_the_fields_to_change(lm):
  model, params = lm
  evaluators = {
    'lower batch_size or raise max_tokens': Static(bptt=7, batch_size=60, max_tokens=50),
    'fewer than batch_size 121 rows: lower batch_size$': MCDropout(bptt=7, batch_size=121),
    'valid split scores 20 tokens, fewer than batch_size 30': Dynamic(
      bptt=7, batch_size=30, max_tokens=20
    ),
    'ms_batch_size 301 is more rows than the train split has tokens \\(300\\)': Dynamic(
      bptt=7, rule='rms', ms_batch_size=301
    ),
  }
  for message, evaluator in evaluators.items():
    with pytest.raises(ConfigError, match=message):
      evaluator(model, params, CORPUS, 'valid')


def test_sgd_searches_no_epsilon_and_a_rule_reads_only_searched_settings():
  grid = Dynamic(bptt=5, rule='sgd', learning_rate=(0.1, 0.2), eps=(1e-3, 1e-2)).grid()
  assert [(s.learning_rate, s.eps) for s in grid] == [(0.1, 0.0), (0.2, 0.0)]
  assert len(Dynamic(bptt=5, rule='rms', learning_rate=(0.1, 0.2), eps=(1e-3, 1e-2)).grid()) == 4
  with pytest.raises(ValueError, match='a rule reads settings of'):
    DynamicRuleSpec(('momentum',), lambda statistics, decay_mean: dynamic_sgd)
  with pytest.raises(ValueError, match='positive ones among them'):
    DynamicRuleSpec(
      ('learning_rate',), lambda statistics, decay_mean: dynamic_sgd, positive=('eps',)
    )


def test_the_learned_evaluator_without_a_meta_learner_says_how_to_get_one():
  with pytest.raises(ConfigError, match='lm-zoo-meta-train'):
    build_evaluator(evaluation_config('learned'), bptt=5, batch_size=1)


def test_every_evaluator_of_the_config_is_built_with_the_run_s_windows(lm):
  model, params = lm
  for name in ('static', 'mc_dropout', 'temperature', 'dynamic', 'token_losses'):
    config = evaluation_config(name)
    config.mc_dropout.samples = 2
    config.max_tokens = 30
    result = build_evaluator(config, bptt=6, batch_size=2)(model, params, CORPUS, 'test')
    assert result.num_tokens == 30 and np.isfinite(result.loss), name
