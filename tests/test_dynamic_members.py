"""Several dynamic evaluations of one stream at once (`dynamic_evaluate_many`):
each member's score and final weights against its own `dynamic_evaluate`,
one compiled scan for members of one program, and each member's divergence
its own."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import perturb

from lm_zoo.cells import LSTMCell
from lm_zoo.errors import TrainingError
from lm_zoo.evaluation import (
  DynamicEvalSettings,
  DynamicMember,
  DynamicSetup,
  dynamic,
  dynamic_evaluate,
  dynamic_evaluate_many,
)
from lm_zoo.evaluation.dynamic import _scan_members, _scan_segments
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.optim import dynamic_rms, dynamic_sgd

V = 11
STREAM = np.random.default_rng(1).integers(0, V, 57).astype(np.int32)


@pytest.fixture(scope='module')
def lm():
  model = RecurrentLM(Embedding(V, 5), Stack([LSTMCell(6)]), Softmax(V))
  return model, perturb(init_params(model, jax.random.key(0)))


def _injected_sgd(params, learning_rate, decay):
  """SGD with its settings in its state, as the `Dynamic` evaluator makes it."""
  injected = optax.inject_hyperparams(dynamic_sgd)(learning_rate=learning_rate, decay=decay)
  return DynamicMember(params, injected, injected.init(params))


def _assert_same_run(together, alone):
  np.testing.assert_allclose(together.segment_nll, alone.segment_nll, rtol=1e-5)
  np.testing.assert_array_equal(together.segment_tokens, alone.segment_tokens)
  np.testing.assert_allclose(together.result.loss, alone.result.loss, rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    together.params,
    alone.params,
  )


def test_each_member_scores_as_it_would_alone(lm):
  """Settings of one weights (the weights shared) and other weights with
  their own MS: one compiled scan, and every member's segment losses and
  final weights are its own run's."""
  model, params = lm
  other = perturb(params, seed=4, scale=0.05)
  ms = [jax.tree.map(lambda p, s=s: jnp.full(p.shape, s), params) for s in (0.4, 1.5)]
  members = [
    DynamicMember(params, dynamic_rms(0.05, 0.02, 1e-3, ms[0])),
    DynamicMember(other, dynamic_rms(0.05, 0.02, 1e-3, ms[1])),
  ]
  _scan_members.clear_cache()
  together = dynamic_evaluate_many(model, members, STREAM, 6)
  assert _scan_members._cache_size() == 1
  for run, member in zip(together, members):
    alone = dynamic_evaluate(model, member.params, member.transformation, STREAM, 6)
    _assert_same_run(run, alone)
  assert abs(together[0].result.loss - together[1].result.loss) > 1e-3

  settings = [(0.3, 0.0), (1.0, 0.05), (0.0, 0.0)]
  searched = dynamic_evaluate_many(
    model, [_injected_sgd(params, *s) for s in settings], STREAM, 6, batch_size=2
  )
  for run, (lr, decay) in zip(searched, settings):
    _assert_same_run(run, dynamic_evaluate(model, params, dynamic_sgd(lr, decay), STREAM, 6, 2))


def test_a_diverging_member_is_its_own_error(lm):
  model, params = lm
  runs = dynamic_evaluate_many(
    model, [_injected_sgd(params, lr, 0.0) for lr in (0.1, 1e4)], STREAM, 5
  )
  assert isinstance(runs[1], TrainingError) and 'diverged' in str(runs[1])
  _assert_same_run(runs[0], dynamic_evaluate(model, params, dynamic_sgd(0.1), STREAM, 5))
  with pytest.raises(TrainingError, match='diverged'):
    dynamic_evaluate(model, params, dynamic_sgd(1e4), STREAM, 5)


def test_max_members_and_other_programs_split_the_members(lm):
  """At most `max_members` a scan; a rule holding its settings as arrays is
  another program and runs on its own; the order of the results is the
  order of the members."""
  model, params = lm
  members = [_injected_sgd(params, lr, 0.0) for lr in (0.2, 0.4, 0.6)]
  members.insert(1, DynamicMember(params, dynamic_sgd(jnp.float32(0.5))))
  _scan_members.clear_cache()
  _scan_segments.clear_cache()
  runs = dynamic_evaluate_many(model, members, STREAM, 7, max_members=2)
  assert _scan_members._cache_size() == 1  # the injected three: 2 members, then 1 alone
  assert _scan_segments._cache_size() == 2  # the third injected one; the array-holding rule
  for run, lr in zip(runs, (0.2, 0.5, 0.4, 0.6)):
    _assert_same_run(run, dynamic_evaluate(model, params, dynamic_sgd(lr), STREAM, 7))


def _jitted_sgd(learning_rate):
  """SGD whose step is a jitted function holding its rate as an array: the
  update's program reads the same for every rate."""
  rate = jnp.float32(learning_rate)
  step = jax.jit(lambda grads: jax.tree.map(lambda g: -rate * g, grads))
  return optax.GradientTransformation(
    lambda params: optax.EmptyState(), lambda updates, state, params=None: (step(updates), state)
  )


def test_a_rule_whose_inner_function_holds_an_array_is_its_own_program(lm):
  """Together or one after another, each rate is its own run, not the
  first one's compiled again."""
  model, params = lm
  rates = (0.0, 0.5)
  together = dynamic_evaluate_many(
    model, [DynamicMember(params, _jitted_sgd(r)) for r in rates], STREAM, 5
  )
  alone = [dynamic_evaluate(model, params, _jitted_sgd(r), STREAM, 5) for r in rates]
  for run, by_itself, rate in zip(together, alone, rates):
    expected = dynamic_evaluate(model, params, dynamic_sgd(rate), STREAM, 5)
    _assert_same_run(run, expected)
    _assert_same_run(by_itself, expected)


def _evaluator_members(setup, params, rates):
  """As the `Dynamic` evaluator makes them: one state a rule, reused."""
  settings = [DynamicEvalSettings('rms', r, 0.02, 1e-3, 5) for r in rates]
  return [DynamicMember(params, *setup.transformation(each, params)) for each in settings]


def _own_members(setup, params, rates):
  """As a user writes them: each transformation's own `init`, whose state
  holds its own copies of MS and the trained weights."""
  rms = optax.inject_hyperparams(dynamic_rms)
  return [
    DynamicMember(
      params, rms(learning_rate=r, decay=0.02, eps=1e-3, rms_gradients=setup.rms_gradients)
    )
    for r in rates
  ]


@pytest.mark.parametrize(
  'make_members', [_evaluator_members, _own_members], ids=['evaluator', 'own']
)
def test_what_every_member_shares_is_carried_once(lm, monkeypatch, make_members):
  """RMS settings of one weights: in the vmapped scan's loop only the
  adapted weights and the recurrent state have a member axis; MS and the
  trained weights the decay pulls toward are one array for all, whether the
  members share one state or each `init` made its own copies."""
  model, params = lm
  setup = DynamicSetup(jax.tree.map(lambda p: jnp.full(p.shape, 0.7), params))
  rates = (0.05, 0.1, 0.2)
  members = make_members(setup, params, rates)
  traced, scan_members = [], dynamic._scan_members
  monkeypatch.setattr(
    dynamic,
    '_scan_members',
    lambda *args: traced.append(scan_members.trace(*args).jaxpr) or scan_members(*args),
  )
  runs = dynamic_evaluate_many(model, members, STREAM, 5)
  for run, rate in zip(runs, rates):
    rms = dynamic_rms(rate, 0.02, 1e-3, setup.rms_gradients)
    _assert_same_run(run, dynamic_evaluate(model, params, rms, STREAM, 5))
  (scan,) = [eqn for eqn in traced[0].eqns if eqn.primitive.name == 'scan']
  # What the loop body reads: its constants, its carry, one segment.
  read = [var.aval for var in scan.params['jaxpr'].jaxpr.invars]
  per_member = sum(a.size for a in read if a.ndim >= 2 and a.shape[0] == len(rates))
  weights = sum(leaf.size for leaf in jax.tree.leaves(params))
  state = sum(leaf.size for leaf in jax.tree.leaves(model.initialize_carry(1)))
  assert per_member == len(rates) * (weights + state)


def test_identical_members_share_one_run(lm, monkeypatch):
  from lm_zoo.evaluation import dynamic

  model, params = lm
  member = _injected_sgd(params, 0.3, 0.0)
  calls = []
  for name in ('_scan_segments', '_scan_members'):
    scan = getattr(dynamic, name)
    monkeypatch.setattr(
      dynamic, name, lambda *a, scan=scan, name=name: calls.append(name) or scan(*a)
    )
  first, second = dynamic_evaluate_many(model, [member, member], STREAM, 7)
  assert calls == ['_scan_segments']  # one run alone, not a scan of two members
  _assert_same_run(first, dynamic_evaluate(model, params, dynamic_sgd(0.3), STREAM, 7))
  _assert_same_run(second, first)


@pytest.mark.parametrize(
  'members, max_members, message',
  [
    ([], 0, 'members is empty'),
    (None, -1, 'max_members must be a whole number >= 0'),
    (None, True, 'max_members must be a whole number >= 0'),
  ],
)
def test_bad_arguments_are_refused(lm, members, max_members, message):
  model, params = lm
  members = [_injected_sgd(params, 0.1, 0.0)] if members is None else members
  with pytest.raises(ValueError, match=message):
    dynamic_evaluate_many(model, members, STREAM, 5, max_members=max_members)
