"""Initialisation schemes (`model.init`) against the authors' code's rules,
written again here: torch's U(±1/√n) for an LSTM of hidden size n and
U(±1/√fan_in) for `nn.Linear`; lamb's normal of deviation √(1.3 / fan_in)
cut at two deviations; TensorFlow's fan-out variance scaling of the embedding."""

import functools
import operator
from runpy import run_path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, load_experiment
from scipy import stats

from lm_zoo.cells import LSTMCell
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import (
  Dual,
  Embedding,
  RecurrentLM,
  Softmax,
  Stack,
  build_model,
  describe_model,
  init_params,
)
from lm_zoo.models.init_schemes import redraw, scheme_draws
from lm_zoo.training.config_checks import validate_config

VOCAB = 200
# the standard deviation of a unit normal cut at ±2, not rescaled
CUT_STD = stats.truncnorm(-2, 2).std()


def _built(init: str, **model):
  cfg = base_config().model
  cfg.update(init=init, **model)
  return build_model(cfg, VOCAB)


def _params(model, init: str):
  return jax.tree.map(np.asarray, init_params(model, jax.random.key(3), init))


def _uniform_like(x, bound):
  """Entries inside ±bound that spread as U(±bound) does (std bound/√3)."""
  assert np.abs(x).max() <= bound
  np.testing.assert_allclose(x.std(), bound / np.sqrt(3), rtol=0.06)


def _cut_normal_like(x, deviation, mean=0.0):
  """Entries inside mean ± 2 deviations, spread as that cut normal."""
  assert np.abs(x - mean).max() <= 2 * deviation * (1 + 1e-6)
  np.testing.assert_allclose((x - mean).std(), CUT_STD * deviation, rtol=0.06)


def test_torch_draws_each_lstm_from_its_hidden_size_and_keeps_the_rest():
  """AWD-LSTM's stack: layers 64, 64 and a last of the embedding's 32, with
  torch's two gate biases; no forget-gate offset; tied softmax."""
  model = _built(
    'torch', num_layers=3, hidden_size=64, embed_size=32, output_size=32, recurrent_bias=True,
    tie_embeddings=True,
  )  # fmt: skip
  torch, default = _params(model, 'torch'), _params(model, 'default')
  for i, n in enumerate((64, 64, 32)):
    cell = torch['stack'][f'cell_{i}']
    for x in (cell['input']['kernel'], cell['recurrent_kernel']):
      _uniform_like(x, 1 / np.sqrt(n))
    _uniform_like(np.concatenate([cell['input']['bias'], cell['recurrent_bias']]), 1 / np.sqrt(n))
    forget = cell['input']['bias'][n : 2 * n]
    assert abs(forget.mean()) < 3 / np.sqrt(3 * n) / np.sqrt(n)  # no +1 offset
  np.testing.assert_array_equal(torch['embedding']['embedding'], default['embedding']['embedding'])
  assert set(torch['head']) == {'bias'} and not torch['head']['bias'].any()


def test_torch_draws_an_untied_softmax_as_the_authors_decoder():
  torch = _params(_built('torch', num_layers=1, hidden_size=16), 'torch')
  _uniform_like(torch['head']['kernel'], 0.1)
  assert not torch['head']['bias'].any()


def test_torch_alstm_draws_the_adaptation_model_and_policy_and_keeps_w_and_v():
  model = _built(
    'torch', cell='alstm', num_layers=2, hidden_size=24, embed_size=16, head='mos',
    alstm={'latent': 'lstm_rhn', 'latent_size': 40, 'orthogonal_per_gate': False},
    mos={'components': 3},
  )  # fmt: skip
  torch, default = _params(model, 'torch'), _params(model, 'default')
  for i in range(2):
    cell, kept = torch['stack'][f'cell_{i}'], default['stack'][f'cell_{i}']
    for x in jax.tree.leaves(cell['latent']):
      assert np.abs(x).max() <= 1 / np.sqrt(40)
    _uniform_like(cell['latent']['input']['kernel'], 1 / np.sqrt(40))
    _uniform_like(cell['policy']['kernel'], 1 / np.sqrt(40))
    for part in ('input', 'recurrent'):
      for name, x in cell[part].items():
        np.testing.assert_array_equal(x, kept[part][name])
  head = torch['head']
  for x in (head['prior']['kernel'], head['latent']['kernel'], head['latent']['bias']):
    assert np.abs(x).max() <= 1 / np.sqrt(24) < 2 * x.std()  # nn.Linear(nhidlast, ...)
  _uniform_like(head['latent']['kernel'], 1 / np.sqrt(24))
  _uniform_like(head['softmax']['kernel'], 0.1)
  assert not head['bias'].any()


@pytest.mark.parametrize('rank', [0, 4])
def test_lamb_draws_gates_from_fan_in_and_the_embedding_from_fan_out(rank):
  model = _built(
    'lamb', num_layers=1, hidden_size=64, embed_size=48, forget_bias=1.0,
    mogrifier={'rounds': 4, 'rank': rank},
  )  # fmt: skip
  lamb, default = _params(model, 'lamb'), _params(model, 'default')
  cell = lamb['stack']['cell_0']
  kept = default['stack']['cell_0']['cell']
  for path, fan_in in ((('input', 'kernel'), 48), (('recurrent_kernel',), 64)):
    x = functools.reduce(operator.getitem, path, cell['cell'])
    _cut_normal_like(x, np.sqrt(1.3 / fan_in))
    # TensorFlow's and flax's fan-in scaling differ by 0.3%: it must be a new draw
    assert not np.array_equal(x, functools.reduce(operator.getitem, path, kept))
  _cut_normal_like(lamb['embedding']['embedding'], 1 / (np.sqrt(48) * 0.87962566103423978))
  for name in ('q1', 'r2', 'q3', 'r4'):
    fan_in = 64 if name[0] == 'q' else 48
    if rank:  # the factors start as lamb's in every scheme
      np.testing.assert_array_equal(
        cell[name]['kernel_in'], default['stack']['cell_0'][name]['kernel_in']
      )
    else:
      _cut_normal_like(cell[name]['kernel'], np.sqrt(1.3 / fan_in))
      assert not np.array_equal(cell[name]['kernel'], default['stack']['cell_0'][name]['kernel'])
    assert not cell[name]['bias'].any()


def test_lamb_draws_each_gate_bias_around_its_mean():
  n = 512
  lamb = _params(_built('lamb', num_layers=1, hidden_size=n, forget_bias=2.0), 'lamb')
  bias = lamb['stack']['cell_0']['input']['bias'].reshape(4, n)  # i, f, j, o
  _cut_normal_like(bias - np.array([0.0, 2.0, 0.0, 0.0])[:, None], np.sqrt(1.3 / n))
  np.testing.assert_allclose(bias.mean(1), [0, 2, 0, 0], atol=4 * CUT_STD * np.sqrt(1.3 / n**2))


def test_lamb_keeps_a_second_gate_bias_at_zero_and_its_mixture_and_draws_the_projection():
  model = _built(
    'lamb', num_layers=1, hidden_size=16, embed_size=8, recurrent_bias=True, tie_embeddings=True,
    mogrifier={'rounds': 2},
  )  # fmt: skip
  lamb = _params(model, 'lamb')
  assert not lamb['stack']['cell_0']['cell']['recurrent_bias'].any()
  projection = lamb['head']['projection']['kernel']  # lm.py's orthogonal downprojection
  np.testing.assert_allclose(projection.T @ projection, np.eye(8), atol=1e-5)
  mixture = _built('lamb', num_layers=1, hidden_size=16, head='mos', mos={'components': 2})
  lamb, default = _params(mixture, 'lamb'), _params(mixture, 'default')
  for got, kept in zip(jax.tree.leaves(lamb['head']), jax.tree.leaves(default['head'])):
    np.testing.assert_array_equal(got, kept)


def test_a_scheme_keeps_the_parameter_dtype():
  model = RecurrentLM(
    Embedding(VOCAB, 8), Stack([LSTMCell(8, param_dtype=jnp.bfloat16)]), Softmax(VOCAB)
  )
  for init in ('torch', 'lamb'):
    cell = init_params(model, jax.random.key(0), init)['stack']['cell_0']
    assert {x.dtype for x in jax.tree.leaves(cell)} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize(
  ('init', 'model', 'part'),
  [
    ('torch', {'cell': 'gru'}, 'GRUCell at stack/cell_0'),
    ('torch', {'mogrifier': {'rounds': 2}}, 'Mogrify at stack/cell_0'),
    ('lamb', {'cell': 'gru', 'mogrifier': {'rounds': 2}}, 'GRUCell inside Mogrify at stack/cell_0'),
    (
      'torch',
      {'cell': 'alstm', 'alstm': {'latent': 'static', 'orthogonal_per_gate': False}},
      'StaticLatent adaptation model at stack/cell_0/latent',
    ),
    ('torch', {'cell': 'alstm'}, 'W and V orthogonal per gate at stack/cell_0.*=False'),
    ('torch', {'embed_size': 4, 'tie_embeddings': True}, 'projection from the last layer.*size'),
    ('lamb', {'cell': 'alstm', 'alstm': {'latent_size': 4}}, 'ALSTMCell at stack/cell_0'),
    ('lamb', {'dual': {'size': 4}}, 'Dual at bridge'),
  ],
)
def test_a_part_without_the_authors_rule_is_refused_before_any_data(init, model, part):
  """`validate_config` (a run's first check, and a tuning study's over its
  ranges) refuses it, as `build_model` does."""
  config = base_config()
  config.model.update(init=init, num_layers=1, hidden_size=8, **model)
  message = f"config field model.init='{init}' has no rule for the {part}.*init='default'"
  with pytest.raises(ConfigError, match=message):
    validate_config(config)
  with pytest.raises(ConfigError, match=message):
    build_model(config.model, VOCAB)


def test_the_api_refuses_in_one_line_too():
  model = RecurrentLM(Embedding(VOCAB, 8), Stack([LSTMCell(8)]), Softmax(VOCAB), Dual(4))
  with pytest.raises(ValueError, match="init='torch' has no rule for the Dual at bridge"):
    init_params(model, jax.random.key(0), 'torch')
  with pytest.raises(ValueError, match='init must be one of default, uniform, torch, lamb'):
    scheme_draws(model, 'xavier')
  with pytest.raises(ValueError, match="init_scale=0.1 applies to init='uniform' only: set it 0"):
    init_params(model, jax.random.key(0), 'default', 0.1)
  with pytest.raises(ValueError, match="init='uniform' needs init_scale > 0, got 0.0"):
    init_params(model, jax.random.key(0), 'uniform')


def test_a_rule_naming_no_parameter_is_an_error():
  """A part renamed under a scheme's rules fails, not silently keeps the default."""
  model = RecurrentLM(Embedding(VOCAB, 8), Stack([LSTMCell(8)]), Softmax(VOCAB))
  params = init_params(model, jax.random.key(0))
  draws = {**scheme_draws(model, 'torch'), 'stack/cell_0/renamed': lambda *a: None}
  with pytest.raises(
    ValueError, match=r"names parameters the model lacks: \['stack/cell_0/renamed'\]"
  ):
    redraw(params, draws, jax.random.key(1))


@pytest.mark.parametrize(
  ('fields', 'message'),
  [
    ({'init': 'uniform'}, "model.init_scale=0.0 must be > 0 under model.init='uniform'"),
    ({'init_scale': 0.05}, "model.init_scale=0.05 applies to model.init='uniform' only.*set it 0"),
    ({'init': 'he'}, "model.init='he' is not known: choose one of default, uniform, torch, lamb"),
  ],
)
def test_scheme_and_scale_are_checked_together(fields, message):
  with pytest.raises(ConfigError, match=message):
    _built(fields.pop('init', 'default'), num_layers=1, hidden_size=8, **fields)


def test_uniform_draws_every_parameter():
  model = _built('uniform', num_layers=1, hidden_size=64, init_scale=0.05)
  leaves = jax.tree.leaves(init_params(model, jax.random.key(0), 'uniform', 0.05))
  _uniform_like(np.concatenate([np.ravel(x) for x in leaves]), 0.05)


@pytest.mark.parametrize(
  ('name', 'variants', 'init'),
  [
    ('awd_lstm', ['ptb'], 'torch'),
    ('alstm_paper', ['ptb', 'wikitext2'], 'torch'),
    (
      'mogrifier_paper',
      list(run_path(str(REPO / 'experiments' / 'mogrifier_paper.py'))['VARIANTS']),
      'lamb',
    ),
    ('ptb_lstm_medium', ['code', 'paper'], 'uniform'),
  ],
)
def test_paper_recipes_take_their_authors_scheme(name, variants, init):
  for variant in variants:
    config = load_experiment(name, variant)
    assert config.model.init == init, variant
    if name != 'mogrifier_paper':  # built at its budget in test_configs.py
      words = describe_model(config.model, build_model(config.model, 10_000))
      assert words.endswith(f'{init} initialisation' + (' ±0.05' if init == 'uniform' else ''))
