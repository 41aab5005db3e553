"""The language model's stack of layers: against nn.RNN layer by layer, its
dropout masks (shared over time, or lamb's per step), skip connections over
any cell, and each scan's gradients and memory."""

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import loss_and_grads
from tiny_lms import apply_lm, projected, tiny_lm

from lm_zoo.cells import LSTMCell, MLSTMCell, Mogrify
from lm_zoo.errors import ConfigError
from lm_zoo.models import LSTMRHN, Embedding, Stack, init_params


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


@partial(jax.jit, static_argnums=0)
def _rnn_layer(cell, params, x):
  """`cell` with `params` run alone over x (B, T, m) by flax's nn.RNN."""
  return nn.RNN(cell).apply({'params': {'cell': params}}, x)


def test_stack_equals_nn_rnn_layers():
  model = tiny_lm()
  tokens = np.random.default_rng(0).integers(0, 31, (3, 9)).astype(np.int32)
  params = init_params(model, jax.random.key(0))
  logits, _ = apply_lm(model, params, tokens)

  x = np.asarray(params['embedding']['embedding'])[tokens]
  for i, n in enumerate((5, 4)):
    x = _rnn_layer(LSTMCell(n), params['stack'][f'cell_{i}'], x)
  np.testing.assert_allclose(logits, projected(params, x), rtol=1e-5, atol=1e-5)


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
  model = tiny_lm(
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
  _, sown = apply_lm(
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
  _, sown_2 = apply_lm(
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

  model = tiny_lm((5, 5, 5), skip_connections=True)
  tokens = np.random.default_rng(6).integers(0, 31, (3, 7)).astype(np.int32)
  params = jax.tree.map(
    lambda x: np.asarray(x) + np.float32(0.1), init_params(model, jax.random.key(0))
  )
  logits, _ = apply_lm(model, params, tokens)
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
  np.testing.assert_allclose(logits, projected(params, total), rtol=1e-4, atol=1e-5)
  with pytest.raises(ConfigError, match='give every layer one size'):  # raised when traced
    jax.eval_shape(
      tiny_lm((5, 4), skip_connections=True).init,
      jax.random.key(0),
      tokens,
      tiny_lm((5, 4)).initialize_carry(3),
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
  model = tiny_lm((5, 5, 5), make_cell, skip_connections=True)
  tokens = np.random.default_rng(7).integers(0, 31, (3, 6)).astype(np.int32)
  params = init_params(model, jax.random.key(1))
  logits, _ = apply_lm(model, params, tokens)
  x = np.asarray(params['embedding']['embedding'])[tokens]
  total = 0
  for i in range(3):
    x = np.asarray(_rnn_layer(make_cell(5), params['stack'][f'cell_{i}'], x))
    total = total + x
  np.testing.assert_allclose(logits, projected(params, total), rtol=1e-5, atol=1e-5)


# Both sides compiled whole, the same way; the fused side once for both cases.
_loss_and_grads = jax.jit(loss_and_grads, static_argnums=0, static_argnames='train')


@pytest.mark.parametrize('scan', ['hoisted', 'remat'])
def test_each_scan_keeps_the_gradients_of_the_fused_one(scan):
  """The hand-written LSTM backward pass ('auto' is 'fused' here) and
  recomputation in the backward pass change how the gradient is computed, not
  its value (dropout on the state included)."""
  tokens = np.random.default_rng(2).integers(0, 31, (4, 12)).astype(np.int32)
  model = tiny_lm(dropout_state=0.3, dropout_hidden=0.2)
  params = init_params(model, jax.random.key(1))
  loss, grads = _loss_and_grads(model, params, tokens, train=True)
  other = tiny_lm(dropout_state=0.3, dropout_hidden=0.2, scan=scan)
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

  model = lambda scan: tiny_lm((64, 64), embedding=Embedding(31, 32), scan=scan)
  assert temp_bytes(model('remat')) < 0.45 * temp_bytes(model('auto'))


@pytest.mark.parametrize('stack', [Stack, LSTMRHN], ids=['Stack', 'LSTMRHN'])
def test_a_stacks_rates_and_switches_are_keyword_only(stack):
  """Only `cells` is positional (then flax's `parent`): rates given by
  position, which would land in whatever fields stand there, are refused."""
  with pytest.raises(TypeError, match='positional'):
    stack([LSTMCell(4)], 0.1, 0.1, 0.1)
  assert stack([LSTMCell(4)], dropout_hidden=0.1).dropout_hidden == 0.1
