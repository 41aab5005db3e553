"""The language model: its stack against nn.RNN, dropout masks, tying, any cell."""

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import loss_and_grads
from lm_zoo.cells import LSTMCell, MLSTMCell, Mogrify
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import (
  Dual,
  Embedding,
  MixtureHead,
  RecurrentLM,
  Softmax,
  Stack,
  TiedSoftmax,
  build_model,
  init_params,
)


class EchoCell(nn.RNNCellBase):
  """Outputs its input and its incoming h; the new h is all ones.

  It makes the dropout masks that reach a cell visible.
  """

  features: int

  @nn.compact
  def __call__(self, carry, x):
    return jnp.ones_like(carry), jnp.concatenate([x, carry], axis=-1)

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    return jnp.ones((*input_shape[:-1], self.features))

  @property
  def num_feature_axes(self):
    return 1


def _lm(sizes=(5, 4), make_cell=LSTMCell, embedding=None, head=None, bridge=None, **stack):
  """31 token types embedded in 6 dimensions, a layer of each size, a softmax."""
  return RecurrentLM(
    embedding or Embedding(31, 6),
    Stack([make_cell(n) for n in sizes], **stack),
    head or Softmax(31),
    bridge,
  )


# Run op by op, each of these would compile every operation of the model on its
# own; jitted with the model static, equal models of equal shapes compile once
# in the whole file.
@partial(jax.jit, static_argnames=('model', 'train', 'mutable'))
def _apply(model, params, tokens, carries=None, train=False, dropout_key=None, mutable=False):
  """model.apply on `tokens` from `carries` (the zero state if None)."""
  if carries is None:
    carries = model.initialize_carry(tokens.shape[0])
  rngs = {'dropout': dropout_key} if train else None
  return model.apply({'params': params}, tokens, carries, train=train, rngs=rngs, mutable=mutable)


@partial(jax.jit, static_argnums=0)
def _rnn_layer(cell, params, x):
  """`cell` with `params` run alone over x (B, T, m) by flax's nn.RNN."""
  return nn.RNN(cell).apply({'params': {'cell': params}}, x)


def _projected(params, h):
  """h @ W^T + b of the untied softmax, in NumPy."""
  return np.asarray(h) @ np.asarray(params['head']['kernel']).T + np.asarray(params['head']['bias'])


def test_stack_equals_nn_rnn_layers():
  model = _lm()
  tokens = np.random.default_rng(0).integers(0, 31, (3, 9)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  logits, _ = _apply(model, params, tokens)

  x = np.asarray(params['embedding']['embedding'])[tokens]
  for i, n in enumerate((5, 4)):
    x = _rnn_layer(LSTMCell(n), params['stack'][f'cell_{i}'], x)
  np.testing.assert_allclose(logits, _projected(params, x), rtol=1e-5, atol=1e-5)


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
  model = _lm()
  # test_stack_equals_nn_rnn_layers's shapes: the whole window's program is compiled once.
  tokens = np.random.default_rng(1).integers(0, 31, (3, 9)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  whole, _ = _apply(model, params, tokens)
  first, carries = _apply(model, params, tokens[:, :4])
  second, _ = _apply(model, params, tokens[:, 4:], carries)
  np.testing.assert_allclose(np.concatenate([first, second], 1), whole, atol=1e-5)


@partial(jax.jit, static_argnames=('stack', 'train'))
def _run_stack(stack, carries, xs, train, dropout_key):
  """`stack` (of cells without parameters) initialised and applied to xs."""
  variables = stack.init(jax.random.key(0), carries, xs, train=False)
  return stack.apply(variables, carries, xs, train=train, rngs={'dropout': dropout_key})


def test_dropout_masks_are_shared_over_time():
  stack = Stack([EchoCell(3), EchoCell(6)], dropout_hidden=0.5, dropout_state=0.5)
  xs = jnp.ones((12, 8, 2))  # (T, B, m)
  carries = [jnp.ones((8, 3)), jnp.ones((8, 6))]
  _, ys = _run_stack(stack, carries, xs, True, jax.random.key(3))
  ys = np.asarray(ys)
  # every feature is zero at all steps or at none: one mask per call
  zero = ys == 0
  assert np.all(zero == zero[:1])
  assert 0.2 < zero.mean() < 0.8
  assert set(np.unique(ys)) <= {0.0, 2.0, 4.0}  # 1/(1-p) scaling, twice at most
  _, again = _run_stack(stack, carries, xs, False, jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(again)[:, :, :2], 1.0)  # none at eval


def test_dropout_off_at_evaluation_and_on_in_training():
  model = _lm(
    embedding=Embedding(31, 6, dropout=0.5),
    dropout_hidden=0.5,
    dropout_state=0.5,
    dropout_output=0.5,
  )
  tokens = jnp.zeros((2, 5), jnp.int32)
  params = init_params(model, jax.random.key(0))
  a, _ = _apply(model, params, tokens)
  b, _ = _apply(model, params, tokens)
  np.testing.assert_array_equal(a, b)
  c, _ = _apply(model, params, tokens, train=True, dropout_key=jax.random.key(1))
  assert not np.allclose(a, c)


def test_tied_softmax_with_projection():
  model = _lm(head=TiedSoftmax(31))
  params = init_params(model, jax.random.key(0))
  assert params['head']['projection']['kernel'].shape == (4, 6)
  assert 'kernel' not in params['head']
  tokens = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
  logits, _ = _apply(model, params, tokens)
  assert logits.shape == (2, 3, 31)
  same_size = _lm((5, 6), head=TiedSoftmax(31))
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
  params = init_params(_lm(), jax.random.key(0), init_scale=0.1)
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
    _lm().init(jax.random.key(0), jnp.zeros((3,), jnp.int32), _lm().initialize_carry(3))


def test_per_step_dropout_when_not_variational():
  stack = Stack([EchoCell(3), EchoCell(6)], dropout_hidden=0.5, variational=False)
  xs = jnp.ones((12, 8, 2))
  carries = [jnp.ones((8, 3)), jnp.ones((8, 6))]
  _, ys = _run_stack(stack, carries, xs, True, jax.random.key(3))
  zero = np.asarray(ys)[:, :, :2] == 0  # the dropped inputs of layer 2
  assert not np.all(zero == zero[:1])  # masks differ between steps


def test_non_variational_masks_are_lambs():
  """lamb's shared_mask_dropout=False: the input, between-layer and output
  masks are new at every step, each layer's state mask is drawn once per
  window, and the layers' state masks differ."""
  model = _lm(
    (3, 4),
    EchoCell,
    Embedding(31, 6, dropout=0.5, variational=False),
    dropout_hidden=0.5,
    dropout_state=0.5,
    dropout_output=0.5,
    variational=False,
  )
  tokens = np.random.default_rng(5).integers(1, 31, (16, 12)).astype(np.int32)
  carries = [jnp.ones((16, 3)), jnp.ones((16, 4))]
  params = init_params(model, jax.random.key(0))
  _, sown = _apply(
    model,
    params,
    tokens,
    carries,
    train=True,
    dropout_key=jax.random.key(1),
    mutable=('intermediates',),
  )
  out = np.asarray(sown['intermediates']['stack']['output'][0])  # (T, B, 6 + 3 + 4), undropped
  dropped = np.asarray(sown['intermediates']['stack']['dropped_output'][0])
  per_step = lambda zero: not np.all(zero == zero[:1])
  # Layer 2's output: [dropped layer-1 output [dropped embedding, state mask 1], state mask 2].
  assert per_step(out[..., :6] == 0)  # input (and between-layer) masks
  assert per_step(out[..., 6:9] == 0)  # between-layer mask times layer 1's state mask
  state_2 = out[..., 9:] == 0
  assert np.all(state_2 == state_2[:1]) and 0.2 < state_2.mean() < 0.8  # once per window
  assert per_step((dropped == 0) & (out != 0))  # output mask
  _, sown_2 = _apply(
    model,
    params,
    tokens,
    carries,
    train=True,
    dropout_key=jax.random.key(2),
    mutable=('intermediates',),
  )
  assert not np.array_equal(
    np.asarray(sown_2['intermediates']['stack']['output'][0])[..., 9:] == 0, state_2
  )  # a new window, a new state mask


def test_skip_connections_sum_every_layers_output():
  from numpy_reference import lstm_step

  model = _lm((5, 5, 5), skip_connections=True)
  tokens = np.random.default_rng(6).integers(0, 31, (3, 7)).astype(np.int32)
  params = jax.tree.map(
    lambda x: np.asarray(x) + np.float32(0.1), init_params(model, jax.random.key(0))
  )
  logits, _ = _apply(model, params, tokens)
  x = np.asarray(params['embedding']['embedding'])[tokens]  # (B, T, 6)
  total = 0
  for layer in range(3):
    c = h = np.zeros((3, 5))
    outputs = []
    for t in range(7):
      c, h = lstm_step(params['stack'][f'cell_{layer}'], c, h, x[:, t])
      outputs.append(h)
    x = np.stack(outputs, 1)
    total = total + x
  np.testing.assert_allclose(logits, _projected(params, total), rtol=1e-4, atol=1e-5)
  with pytest.raises(ConfigError, match='give every layer one size'):  # raised when traced
    jax.eval_shape(
      _lm((5, 4), skip_connections=True).init,
      jax.random.key(0),
      tokens,
      _lm((5, 4)).initialize_carry(3),
    )


@pytest.mark.parametrize(
  'make_cell',
  [
    lambda n: nn.GRUCell(n),
    lambda n: MLSTMCell(n),
    lambda n: Mogrify(LSTMCell(n), rounds=3),
    lambda n: LSTMCell(n, cap_input_gate=True),
  ],
  ids=['flax_gru', 'mlstm', 'mogrifier', 'capped'],
)
def test_skip_connections_sum_the_layers_of_any_cell(make_cell):
  """Any cell, a wrapper or flax's own: the stack's output is the sum of its
  layers' outputs, each layer run alone in nn.RNN."""
  model = _lm((5, 5, 5), make_cell, skip_connections=True)
  tokens = np.random.default_rng(7).integers(0, 31, (3, 6)).astype(np.int32)
  params = init_params(model, jax.random.key(1))
  logits, _ = _apply(model, params, tokens)
  x = np.asarray(params['embedding']['embedding'])[tokens]
  total = 0
  for i in range(3):
    x = np.asarray(_rnn_layer(make_cell(5), params['stack'][f'cell_{i}'], x))
    total = total + x
  np.testing.assert_allclose(logits, _projected(params, total), rtol=1e-5, atol=1e-5)


def test_dual_connection_feeds_the_softmax():
  """Dual: logits = W_o ReLU(W_d [e_t; h_t] + b_d) + b_o, with h_t the ERS
  model's stack output and e_t the embedded word."""
  model = _lm(bridge=Dual(7))
  tokens = np.random.default_rng(2).integers(0, 31, (3, 5)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  (logits, _), state = _apply(model, params, tokens, mutable=('intermediates',))
  h = np.asarray(state['intermediates']['stack']['output'][0]).transpose(1, 0, 2)
  e = np.asarray(params['embedding']['embedding'])[tokens]
  dense = params['bridge']['dense']
  w, b = np.asarray(dense['kernel']), np.asarray(dense['bias'])
  d = np.maximum(e @ w[:6] + h @ w[6:] + b, 0)
  np.testing.assert_allclose(logits, _projected(params, d), rtol=1e-4, atol=1e-5)
  tied = init_params(_lm(bridge=Dual(7), head=TiedSoftmax(31)), jax.random.key(0))
  assert tied['head']['projection']['kernel'].shape == (7, 6)  # dual size -> embedding


@pytest.mark.parametrize('tie', [False, True])
def test_mixture_of_softmaxes_head(tie):
  model = _lm((5, 6), head=MixtureHead(31, 3, tied=tie))
  tokens = np.random.default_rng(3).integers(0, 31, (2, 4)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  assert params['head']['latent']['kernel'].shape == (6, 3 * 6)
  assert ('softmax' in params['head']) != tie
  log_p, _ = _apply(model, params, tokens)
  assert log_p.shape == (2, 4, 31)
  np.testing.assert_allclose(np.logaddexp.reduce(np.asarray(log_p, np.float64), -1), 0.0, atol=1e-5)
  if tie:  # the mixture's E is the embedding: it gets the softmax's gradient
    grads = jax.jit(jax.grad(lambda p: _apply(model, p, tokens)[0][0, 0, 1]))(params)
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
  logits, _ = _apply(
    model, params, jnp.ones((2, 3), jnp.int32), train=True, dropout_key=jax.random.key(1)
  )
  assert np.all(np.isfinite(logits))
  cfg.dual.dropout_output = 1.0
  with pytest.raises(ConfigError, match='dual.dropout_output=1.0 must be in'):
    build_model(cfg, 20)


# Both sides compiled whole, the same way; the fused side once for both cases.
_loss_and_grads = jax.jit(loss_and_grads, static_argnums=0, static_argnames='train')


@pytest.mark.parametrize('scan', ['hoisted', 'remat'])
def test_each_scan_keeps_the_gradients_of_the_fused_one(scan):
  """The hand-written LSTM backward pass ('auto' is 'fused' here) and
  recomputation in the backward pass change how the gradient is computed, not
  its value (dropout on the state included)."""
  tokens = np.random.default_rng(2).integers(0, 31, (4, 12)).astype(np.int32)
  model = _lm(dropout_state=0.3, dropout_hidden=0.2)
  params = init_params(model, jax.random.key(1))
  loss, grads = _loss_and_grads(model, params, tokens, train=True)
  other = _lm(dropout_state=0.3, dropout_hidden=0.2, scan=scan)
  other_loss, other_grads = _loss_and_grads(other, params, tokens, train=True)
  np.testing.assert_allclose(other_loss, loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(other_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_remat_keeps_a_third_of_the_memory_of_a_long_window():
  """Compiled memory of the gradient over a 300-step window: recomputing each
  step keeps only its input and carry (m + 2n floats per step, against the
  hand-written backward pass's m + 6n)."""
  tokens = np.zeros((8, 301), np.int32)

  def temp_bytes(model):
    params = init_params(model, jax.random.key(0))
    compiled = jax.jit(lambda p: loss_and_grads(model, p, tokens)).lower(params).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  model = lambda scan: _lm((64, 64), embedding=Embedding(31, 32), scan=scan)
  assert temp_bytes(model('remat')) < 0.45 * temp_bytes(model('auto'))
