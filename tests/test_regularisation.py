"""AWD-LSTM's regularisers (embedding dropout, weight drop, AR and TAR) and
lamb's state dropping."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import perturb

from lm_zoo.cells import ALSTMCell, LSTMCell, MLSTMCell, Mogrify
from lm_zoo.configs import base_config
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.models.regularisation import (
  activation_penalty,
  drop_carried_state,
  drop_recurrent_weights,
  hidden_to_hidden,
  temporal_activation_penalty,
)
from lm_zoo.training import create_train_state, make_optimizer, make_train_step

M, N, B, T, V = 3, 4, 2, 5, 11

RECURRENT = {
  'LSTMCell': ['recurrent_kernel'],
  'MLSTMCell': ['lstm/recurrent_kernel'],
  'ALSTMCell': ['latent/recurrent_kernel', 'recurrent/kernel_1'],
  'Mogrify': ['cell/recurrent_kernel'],
  'OptimizedLSTMCell': ['hi/kernel', 'hf/kernel', 'hg/kernel', 'ho/kernel'],
  'GRUCell': ['hr/kernel', 'hz/kernel', 'hn/kernel'],
  'SimpleCell': ['h/kernel'],
}
CELLS = [
  LSTMCell(N),
  MLSTMCell(N),
  ALSTMCell(N, latent_size=3),
  Mogrify(LSTMCell(N), rounds=2, rank=2),
  nn.OptimizedLSTMCell(N),
  nn.GRUCell(N),
  nn.SimpleCell(N),
]


@pytest.mark.parametrize('cell', CELLS, ids=lambda c: type(c).__name__)
def test_weight_drop_finds_each_cells_hidden_to_hidden_matrices(cell):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(B, M)), jnp.float32)
  zero_state = cell.initialize_carry(jax.random.key(0), (B, M))
  params = perturb(cell.init(jax.random.key(0), zero_state, x)['params'])
  found = hidden_to_hidden(cell)
  assert sorted(found) == sorted(RECURRENT[type(cell).__name__])
  # Independent of names: from a zero state the output cannot depend on a
  # hidden-to-hidden matrix, while it does on the input matrices.
  output_norm = lambda p: jnp.sum(cell.apply({'params': p}, zero_state, x)[1] ** 2)
  grads = jax.jit(jax.grad(output_norm))(params)  # compiled whole, not op by op
  flat = {
    '/'.join(str(k.key) for k in path): g
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]
  }
  for path in found:
    np.testing.assert_array_equal(flat[path], 0.0)
  assert any(
    np.abs(g).sum() > 0 for path, g in flat.items() if path not in found and 'kernel' in path
  )


def test_weight_drop_masks_and_scales_only_recurrent_matrices():
  params = {
    'cell': {'recurrent_kernel': jnp.ones((200, 400)), 'input': {'kernel': jnp.ones((5, 400))}},
    'embed': jnp.ones((3, 2)),
  }
  paths = ['cell/recurrent_kernel']
  dropped = drop_recurrent_weights(params, paths, 0.3, jax.random.key(0))
  w = np.asarray(dropped['cell']['recurrent_kernel'])
  np.testing.assert_allclose(np.unique(w), [0.0, 1 / 0.7], rtol=1e-6)
  assert abs((w == 0).mean() - 0.3) < 0.01
  np.testing.assert_array_equal(dropped['cell']['input']['kernel'], 1.0)
  np.testing.assert_array_equal(dropped['embed'], 1.0)
  assert drop_recurrent_weights(params, paths, 0.0, jax.random.key(0)) is params
  with pytest.raises(ValueError, match='weight drop rate'):
    drop_recurrent_weights(params, paths, 1.0, jax.random.key(0))


def _lm(hidden=N, embedding=None, **stack):
  return RecurrentLM(
    embedding or Embedding(V, M), Stack([LSTMCell(hidden)] * 2, **stack), Softmax(V)
  )


def _tokens(seed=1, batch=B, length=T):
  return jnp.asarray(np.random.default_rng(seed).integers(0, V, (batch, length)), jnp.int32)


def _sgd_step(model, ar=0.0, tar=0.0, batch=B, length=T):
  """One SGD step (lr 1, no clipping) of the train step; params before, after, metrics."""
  config = base_config()
  config.optimizer.update(clip_norm=0.0, learning_rate=1.0)
  optimizer = make_optimizer(config.optimizer)
  state = create_train_state(model, optimizer, config)
  state = state.replace(params=perturb(state.params), carries=model.initialize_carry(batch))
  before = jax.tree.map(np.asarray, state.params)
  tokens = _tokens(batch=batch, length=length + 1)
  new_state, metrics = make_train_step(model, optimizer, ar=ar, tar=tar)(
    state, tokens[:, :-1], tokens[:, 1:], jnp.ones((batch, length))
  )
  return before, jax.tree.map(np.asarray, new_state.params), tokens


def test_weight_drop_mask_is_shared_over_time_and_batch():
  # A dropped entry gets no gradient from any step or row of the window, so it
  # stays put; with per-step or per-row masks almost every entry would move.
  before, after, _ = _sgd_step(_lm(hidden=16, weight_drop=0.5), batch=8, length=20)
  unchanged = lambda a, b: float(np.mean(a == b))
  before, after = before['stack']['cell_0'], after['stack']['cell_0']
  assert 0.45 < unchanged(before['recurrent_kernel'], after['recurrent_kernel']) < 0.55
  assert unchanged(before['input']['kernel'], after['input']['kernel']) < 0.05


def test_embedding_dropout_drops_whole_words_in_training_only():
  model = _lm(embedding=Embedding(V, M, dropout_words=0.5, embedding_init=nn.initializers.ones))
  params = init_params(model, jax.random.key(0))
  tokens = _tokens()
  # Each run compiled whole: op by op, every operation would compile on its own.
  _, captured = jax.jit(
    lambda p: model.apply(
      {'params': p},
      tokens,
      model.initialize_carry(B),
      train=True,
      rngs={'dropout': jax.random.key(3)},
      capture_intermediates=True,
      mutable=['intermediates'],
    )
  )(params)
  table = np.asarray(captured['intermediates']['embedding']['word_dropout']['__call__'][0])
  assert table.shape == (V, M)
  # Each word type's row is all dropped or all kept, scaled by 1 / (1 - p).
  assert all(set(row) in ({0.0}, {2.0}) for row in table)
  assert 0 < (table[:, 0] == 0).sum() < V
  evaluated = jax.jit(model.apply)({'params': params}, tokens, model.initialize_carry(B))[0]
  plain = jax.jit(_lm(embedding=Embedding(V, M, embedding_init=nn.initializers.ones)).apply)(
    {'params': params}, tokens, model.initialize_carry(B)
  )[0]
  np.testing.assert_array_equal(evaluated, plain)


def test_ar_and_tar_follow_their_formulas():
  h = np.random.default_rng(2).normal(size=(T, B, N)).astype(np.float32)
  np.testing.assert_allclose(activation_penalty(h, 2.0), 2.0 * np.mean(h**2), rtol=1e-6)
  diffs = [h[t] - h[t - 1] for t in range(1, T)]
  np.testing.assert_allclose(
    temporal_activation_penalty(h, 1.5), 1.5 * np.mean(np.square(diffs)), rtol=1e-6
  )


def test_train_step_adds_ar_on_dropped_and_tar_on_undropped_outputs():
  model = _lm(dropout_output=0.5)
  ar, tar = 2.0, 1.0
  before, after, tokens = _sgd_step(model, ar=ar, tar=tar)
  # The same objective written out: the last layer's outputs are sown.
  config = base_config()
  state = create_train_state(model, optax.sgd(1.0), config)
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 0)
  _, dropout_key = jax.random.split(dropout_key)

  def objective(p):
    (logits, _), sown = model.apply(
      {'params': p},
      tokens[:, :-1],
      model.initialize_carry(B),
      train=True,
      rngs={'dropout': dropout_key},
      mutable=['intermediates'],
    )
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    dropped = sown['intermediates']['stack']['dropped_output'][0]
    undropped = sown['intermediates']['stack']['output'][0]
    return nll + ar * jnp.mean(dropped**2) + tar * jnp.mean((undropped[1:] - undropped[:-1]) ** 2)

  # Compiled whole: op by op, every operation would compile on its own.
  sown = jax.jit(
    lambda p: model.apply(
      {'params': p},
      tokens[:, :-1],
      model.initialize_carry(B),
      train=True,
      rngs={'dropout': dropout_key},
      mutable=['intermediates'],
    )[1]
  )(before)
  assert not np.allclose(
    sown['intermediates']['stack']['dropped_output'][0], sown['intermediates']['stack']['output'][0]
  )
  grads = jax.jit(jax.grad(objective))(before)
  expected = jax.tree.map(lambda p, g: p - np.asarray(g), before, grads)
  for got, want in zip(jax.tree.leaves(after), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class ElmanCell(nn.RNNCellBase):
  """h' = tanh(W x + U h), with U named 'w_hh' and not declared."""

  features: int

  @nn.compact
  def __call__(self, h, x):
    w_hh = self.param('w_hh', nn.initializers.orthogonal(), (self.features, self.features))
    h = jnp.tanh(nn.Dense(self.features)(x) + h @ w_hh)
    return h, h

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    return jnp.zeros((*input_shape[:-1], self.features))

  @property
  def num_feature_axes(self):
    return 1


class DeclaredElmanCell(ElmanCell):
  declared: tuple = ()

  @nn.nowrap
  def hidden_to_hidden(self, of):
    return self.declared


def test_weight_drop_refuses_cells_that_declare_no_recurrent_matrix():
  # e.g. a custom cell whose hidden-to-hidden matrix is named 'w_hh'
  model = lambda cell: RecurrentLM(Embedding(V, M), Stack([cell], weight_drop=0.5), Softmax(V))
  params = init_params(model(ElmanCell(N)), jax.random.key(0))
  with pytest.raises(ValueError, match='ElmanCell does not declare its hidden-to-hidden'):
    model(ElmanCell(N)).dropped_weights(params, jax.random.key(0))
  with pytest.raises(ValueError, match='no hidden-to-hidden matrix'):
    model(DeclaredElmanCell(N, ())).dropped_weights(params, jax.random.key(0))
  dropped = model(DeclaredElmanCell(N, ('w_hh',))).dropped_weights(params, jax.random.key(0))
  assert 0 < np.mean(np.asarray(dropped['stack']['cell_0']['w_hh']) == 0) < 1
  no_drop = RecurrentLM(Embedding(V, M), Stack([ElmanCell(N)]), Softmax(V))
  assert no_drop.dropped_weights(params, jax.random.key(0)) is params


def test_state_drop_zeroes_whole_rows_at_its_rate():
  """lamb's drop_state_probability: each row's carry (every layer, c and h)
  zeroed together with probability p, the rest untouched. Over 200 draws of
  64 rows the dropped fraction lies within 4.5 binomial standard deviations."""
  rate, rows, draws = 0.2, 64, 200
  carries = [
    (jnp.full((rows, 3), 2.0), jnp.full((rows, 3), -1.0)),
    (jnp.full((rows, 5), 0.5), jnp.full((rows, 5), 3.0)),
  ]
  dropped = jax.jit(jax.vmap(lambda key: drop_carried_state(carries, rate, key)))(
    jax.random.split(jax.random.key(0), draws)
  )
  zero = [np.asarray(x) == 0 for x in jax.tree.leaves(dropped)]
  row_zero = zero[0][..., 0]  # (draws, rows)
  for z in zero:  # a row is zeroed in every part of every layer's carry, or in none
    np.testing.assert_array_equal(z, np.broadcast_to(row_zero[..., None], z.shape))
  for kept, original in zip(jax.tree.leaves(dropped), jax.tree.leaves(carries)):
    np.testing.assert_array_equal(
      np.asarray(kept)[~row_zero],
      np.broadcast_to(np.asarray(original), (draws, *original.shape))[~row_zero],
    )  # no rescaling
  n = draws * rows
  assert abs(row_zero.mean() - rate) < 4.5 * np.sqrt(rate * (1 - rate) / n)
  assert 0 < row_zero.sum(1).min() and row_zero.sum(1).max() < rows  # draws differ
  assert drop_carried_state(carries, 0.0, jax.random.key(1)) is carries
  with pytest.raises(ValueError, match='state drop rate'):
    drop_carried_state(carries, 1.0, jax.random.key(1))


def test_the_train_step_drops_states_before_the_window():
  """At a rate near 1 every row starts the window from zero: the step equals
  one from zero carries without state dropping."""
  model = _lm(hidden=6)
  config = base_config()
  optimizer = make_optimizer(config.optimizer)
  tokens = _tokens(length=T + 1)
  batch = (tokens[:, :-1], tokens[:, 1:], jnp.ones((B, T)))

  steps = {
    rate: make_train_step(model, optimizer, drop_state=rate) for rate in (1 - 1e-7, 0.0)
  }  # each compiled once

  def run(rate, value):  # the train step donates its state: a fresh one each time
    carries = jax.tree.map(
      lambda x: np.full((B, *x.shape[1:]), value, x.dtype), model.initialize_carry(B)
    )
    return steps[rate](
      create_train_state(model, optimizer, config).replace(carries=carries), *batch
    )

  dropped, metrics = run(1 - 1e-7, 1.0)
  zero_start, zero_metrics = run(0.0, 0.0)
  _, kept_metrics = run(0.0, 1.0)
  assert float(metrics['loss']) == float(zero_metrics['loss'])
  assert float(metrics['loss']) != float(kept_metrics['loss'])
  jax.tree.map(np.testing.assert_array_equal, dropped.params, zero_start.params)
