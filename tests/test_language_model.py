"""The language model: its parts and carry, dropout, tying, any cell, the dual
connection and the mixture of softmaxes (its stack: test_stacks.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_lms import apply_lm, projected, tiny_lm

from lm_zoo.cells import LSTMCell
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import (
  Dual,
  Embedding,
  MixtureHead,
  RecurrentLM,
  Stack,
  TiedSoftmax,
  build_model,
  init_params,
)


def test_the_parts_are_children_and_each_layer_has_its_own_cell():
  """The tree is keyed by the parts; a template cell given twice makes two
  layers with parameters of their own (not flax's sharing of one instance)."""
  cell = LSTMCell(6)
  model = RecurrentLM(
    Embedding(31, 6), Stack([cell, cell], weight_drop=0.5), TiedSoftmax(31), Dual(7)
  )
  params = init_params(model, jax.random.key(0))
  assert set(params) == {'embedding', 'stack', 'bridge', 'head'}
  assert set(params['stack']) == {'cell_0', 'cell_1'}
  assert set(params['head']) == {'projection', 'bias'} and set(params['bridge']) == {'dense'}
  first, second = (params['stack'][f'cell_{i}']['recurrent_kernel'] for i in range(2))
  assert not np.array_equal(first, second)
  dropped = model.dropped_weights(params, jax.random.key(1))
  for i in range(2):
    kernel = np.asarray(dropped['stack'][f'cell_{i}']['recurrent_kernel'])
    assert 0.4 < np.mean(kernel == 0) < 0.6
  assert dropped['embedding'] is params['embedding'] and dropped['head'] is params['head']


def test_carry_continues_across_calls():
  model = tiny_lm()
  # test_stacks.py's first test's shapes: in one session, the whole window compiles once.
  tokens = np.random.default_rng(1).integers(0, 31, (3, 9)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  whole, _ = apply_lm(model, params, tokens)
  first, carries = apply_lm(model, params, tokens[:, :4])
  second, _ = apply_lm(model, params, tokens[:, 4:], carries)
  np.testing.assert_allclose(np.concatenate([first, second], 1), whole, atol=1e-5)


def test_dropout_off_at_evaluation_and_on_in_training():
  model = tiny_lm(
    embedding=Embedding(31, 6, dropout=0.5),
    dropout_hidden=0.5,
    dropout_state=0.5,
    dropout_output=0.5,
  )
  tokens = jnp.zeros((2, 5), jnp.int32)
  params = init_params(model, jax.random.key(0))
  a, _ = apply_lm(model, params, tokens)
  b, _ = apply_lm(model, params, tokens)
  np.testing.assert_array_equal(a, b)
  c, _ = apply_lm(model, params, tokens, train=True, dropout_key=jax.random.key(1))
  assert not np.allclose(a, c)


def test_tied_softmax_with_projection():
  model = tiny_lm(head=TiedSoftmax(31))
  params = init_params(model, jax.random.key(0))
  assert params['head']['projection']['kernel'].shape == (4, 6)
  assert 'kernel' not in params['head']
  tokens = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
  logits, _ = apply_lm(model, params, tokens)
  assert logits.shape == (2, 3, 31)
  same_size = tiny_lm((5, 6), head=TiedSoftmax(31))
  assert 'projection' not in init_params(same_size, jax.random.key(0))['head']


@pytest.mark.parametrize('cell', ['gru', 'flax_lstm'])
def test_any_flax_cell_is_a_layer(cell):
  cfg = base_config().model
  cfg.cell, cfg.embed_size, cfg.hidden_size, cfg.dropout_state = cell, 8, 8, 0.3
  model = build_model(cfg, 20)
  tokens = jnp.ones((2, 4), jnp.int32)
  params = init_params(model, jax.random.key(0))
  logits, carries = jax.jit(
    lambda p, t, c: model.apply(
      {'params': p}, t, c, train=True, rngs={'dropout': jax.random.key(0)}
    )
  )(params, tokens, model.initialize_carry(2))
  assert logits.shape == (2, 4, 20) and np.all(np.isfinite(logits))


def test_uniform_init_scale():
  params = init_params(tiny_lm(), jax.random.key(0), 'uniform', init_scale=0.1)
  leaves = np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)])
  assert np.abs(leaves).max() <= 0.1 and leaves.std() > 0.05


def test_bad_model_configs():
  cfg = base_config().model
  cfg.cell = 'transformer'
  with pytest.raises(ConfigError, match="model.cell='transformer' is not known"):
    build_model(cfg, 10)
  cfg = base_config().model
  cfg.dropout_hidden = 1.0
  with pytest.raises(ConfigError, match='dropout_hidden=1.0 must be in'):
    build_model(cfg, 10)
  with pytest.raises(ValueError, match='tokens must be'):
    tiny_lm().init(jax.random.key(0), jnp.zeros((3,), jnp.int32), tiny_lm().initialize_carry(3))


def test_dual_connection_feeds_the_softmax():
  """Dual: logits = W_o ReLU(W_d [e_t; h_t] + b_d) + b_o, with h_t the ERS
  model's stack output and e_t the embedded word."""
  model = tiny_lm(bridge=Dual(7))
  tokens = np.random.default_rng(2).integers(0, 31, (3, 5)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  (logits, _), state = apply_lm(model, params, tokens, mutable=('intermediates',))
  h = np.asarray(state['intermediates']['stack']['output'][0]).transpose(1, 0, 2)
  e = np.asarray(params['embedding']['embedding'])[tokens]
  dense = params['bridge']['dense']
  w, b = np.asarray(dense['kernel']), np.asarray(dense['bias'])
  d = np.maximum(e @ w[:6] + h @ w[6:] + b, 0)
  np.testing.assert_allclose(logits, projected(params, d), rtol=1e-4, atol=1e-5)
  tied = init_params(tiny_lm(bridge=Dual(7), head=TiedSoftmax(31)), jax.random.key(0))
  assert tied['head']['projection']['kernel'].shape == (7, 6)  # dual size -> embedding


@pytest.mark.parametrize('tie', [False, True])
def test_mixture_of_softmaxes_head(tie):
  model = tiny_lm((5, 6), head=MixtureHead(31, 3, tied=tie))
  tokens = np.random.default_rng(3).integers(0, 31, (2, 4)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  assert params['head']['latent']['kernel'].shape == (6, 3 * 6)
  assert ('softmax' in params['head']) != tie
  log_p, _ = apply_lm(model, params, tokens)
  assert log_p.shape == (2, 4, 31)
  np.testing.assert_allclose(np.logaddexp.reduce(np.asarray(log_p, np.float64), -1), 0.0, atol=1e-5)
  if tie:  # the mixture's E is the embedding: it gets the softmax's gradient
    grads = jax.jit(jax.grad(lambda p: apply_lm(model, p, tokens)[0][0, 0, 1]))(params)
    assert np.abs(grads['embedding']['embedding'][~np.isin(np.arange(31), tokens)]).max() > 0


def test_dual_and_mos_from_the_config():
  cfg = base_config().model
  cfg.update(embed_size=8, hidden_size=8, tie_embeddings=True, head='mos')
  cfg.dual.update(size=8, dropout_input=0.3, dropout_output=0.2)
  cfg.mos.update(components=2, dropout_latent=0.1)
  model = build_model(cfg, 20)
  assert model.bridge == Dual(8, 0.3, 0.2)
  assert (model.head.components, model.head.dropout_latent, model.head.tied) == (2, 0.1, True)
  params = init_params(model, jax.random.key(0))
  # 16 -> 8 dual layer; prior 8 x 2; latent 8 -> 2 x 8; tied, so one bias of 20.
  assert sum(x.size for x in jax.tree.leaves(params['bridge'])) == 16 * 8 + 8
  assert sum(x.size for x in jax.tree.leaves(params['head'])) == 8 * 2 + 8 * 16 + 16 + 20
  logits, _ = apply_lm(
    model, params, jnp.ones((2, 3), jnp.int32), train=True, dropout_key=jax.random.key(1)
  )
  assert np.all(np.isfinite(logits))
  cfg.dual.dropout_output = 1.0
  with pytest.raises(ConfigError, match='dual.dropout_output=1.0 must be in'):
    build_model(cfg, 20)
