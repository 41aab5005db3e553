"""Models built from a config: the parts the config names, and the scan
switch checked at build."""

import jax
import numpy as np
import pytest

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import (
  LSTMRHN,
  Dual,
  MixtureHead,
  Softmax,
  Stack,
  TiedSoftmax,
  build_model,
  factory,
  init_params,
  layer_sizes,
)


def model_config(fields):
  """A tiny model config (embedding 4, hidden 6, dropouts on) with `fields`."""
  cfg = base_config().model
  cfg.update(
    embed_size=4,
    hidden_size=6,
    dropout_input=0.2,
    dropout_hidden=0.2,
    dropout_state=0.1,
    dropout_output=0.2,
  )
  cfg.update(fields)
  return cfg


def test_the_factory_assembles_the_parts_the_config_names():
  cfg = model_config(
    {
      'tie_embeddings': True,
      'dual': {'size': 5},
      'head': 'mos',
      'mos': {'components': 2, 'dropout_latent': 0.1},
    }
  )
  model = build_model(cfg, 11)
  assert (model.embedding.vocab_size, model.embedding.features, model.vocab_size) == (11, 4, 11)
  assert isinstance(model.stack, Stack) and len(model.stack.cells) == 2
  assert model.stack.dropout_state == 0.1 and model.stack.scan == 'auto'
  assert model.bridge == Dual(5) and model.head == MixtureHead(11, 2, 0.1, tied=True)
  assert build_model(model_config({}), 11).head == Softmax(11)
  assert build_model(model_config({'tie_embeddings': True}), 11).head == TiedSoftmax(11)
  rhn = model_config({'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn'}})
  assert isinstance(build_model(rhn, 11).stack, LSTMRHN)
  # The capped gate reaches the cell inside the Mogrifier's wrapper, and the
  # skip connections the stack, for every cell of the LSTM family.
  for cell in ('lstm', 'mlstm'):
    lamb = model_config(
      {
        'cell': cell,
        'cap_input_gate': True,
        'skip_connections': True,
        'hidden_size': 4,
        'mogrifier': {'rounds': 3, 'rank': 2},
      }
    )
    model = build_model(lamb, 11)
    assert model.stack.skip_connections
    for mogrify in model.stack.cells:
      assert mogrify.rounds == 3 and mogrify.cell.cap_input_gate, (cell, mogrify)


def test_init_params_are_flax_inits_on_real_inputs():
  """init_params gives flax the inputs' shapes only (lazy_init): the values
  of flax's init, which runs the forward pass on real inputs, bit for bit
  (a Mogrifier LSTM, a dual bridge and a tied mixture head)."""
  model = build_model(
    model_config(
      {
        'num_layers': 1,
        'tie_embeddings': True,
        'dual': {'size': 5},
        'head': 'mos',
        'mos': {'components': 2},
        'mogrifier': {'rounds': 2, 'rank': 2},
      }
    ),
    11,
  )
  key = jax.random.key(3)
  tokens = jax.numpy.zeros((1, 1), jax.numpy.int32)
  eager = model.init(jax.random.split(key)[0], tokens, model.initialize_carry(1))['params']
  params = init_params(model, key)
  assert jax.tree.structure(params) == jax.tree.structure(eager)
  for got, expected in zip(jax.tree.leaves(params), jax.tree.leaves(eager)):
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
  'fields',
  [
    {
      'num_layers': 2,
      'dual': {'size': 5},
      'head': 'mos',
      'mos': {'components': 2},
      'mogrifier': {'rounds': 2, 'rank': 2},
    },
    {'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn'}, 'tie_embeddings': True},
  ],
  ids=['mogrifier mos dual', 'alstm lstm_rhn tied'],
)
def test_count_params_counts_the_initialised_parameters(fields):
  model = build_model(model_config(fields), 11)
  params = init_params(model, jax.random.key(0))
  assert factory.count_params(model) == sum(x.size for x in jax.tree.leaves(params))


def test_a_scan_the_cells_cannot_take_is_refused_at_build():
  cfg = base_config().model
  cfg.update(cell='gru', scan='fused')
  with pytest.raises(
    ConfigError,
    match=r"model.scan='fused' cannot run GRUCell: choose one "
    r"of 'auto', 'scan', 'remat' \(--config.model.scan\)",
  ):
    build_model(cfg, 10)
  cfg.update(cell='alstm', scan='hoisted')
  cfg.alstm.latent = 'lstm_rhn'
  with pytest.raises(ConfigError, match="model.scan='hoisted' cannot run LSTMRHNStack"):
    build_model(cfg, 10)
  cfg.scan = 'fastest'
  with pytest.raises(ConfigError, match="model.scan='fastest' is not known"):
    build_model(cfg, 10)


@pytest.mark.parametrize(
  'growth',
  [
    lambda n: 7 * n * n + 3 * n + 50,  # a quadratic: fitted
    lambda n: n**3 // 5 + 40 * n,  # far from one: bisection
    lambda n: 4 * n * n + 9 * (n // 3) * 7,
  ],
)  # sizes rounded
def test_the_solved_hidden_size_is_the_largest_within_the_budget(growth, monkeypatch):
  monkeypatch.setattr(factory, 'assemble', lambda cfg, vocab_size, n: n)
  monkeypatch.setattr(factory, 'count_params', growth)
  # The solver keeps its answers per config: here each growth law is another model.
  monkeypatch.setattr(factory, '_solve_hidden_size', factory._solve_hidden_size.__wrapped__)
  for budget in (growth(1), 1_000, 123_457, 10**7, 987_654_321):
    n = factory.solve_hidden_size(None, 10, budget)
    assert growth(n) <= budget < growth(n + 1)


def test_a_config_s_budget_is_solved_once_per_process(monkeypatch):
  counted = []
  monkeypatch.setattr(
    factory,
    'count_params',
    lambda model, count=factory.count_params: counted.append(1) or count(model),
  )
  cfg = base_config().model
  cfg.update(param_budget=20_011, embed_size=0)  # a budget no other test asks for
  sizes = [layer_sizes(build_model(cfg, 50)) for _ in range(2)]
  first = len(counted)
  assert sizes[0] == sizes[1] and first > 3  # the first build traced several sizes
  build_model(cfg, 50)
  assert len(counted) == first  # the same config: the kept answer
  cfg.param_budget = 30_011
  assert layer_sizes(build_model(cfg, 50))[0] > sizes[0][0] and len(counted) > first
