"""The aLSTM (eq. 8), its adaptation models (eq. 6, 7) and the LSTM-RHN stack
(eq. 9) against NumPy, finite differences and flax's nn.RNN."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import check_reverse_gradient, perturb
from numpy_reference import alstm_step, mogrify

from lm_zoo.cells import ALSTMCell, LSTMCell, LSTMRHNStack, Mogrify, StaticLatent
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import build_model, init_params

M, N, K, B, T = 4, 5, 3, 2, 6  # input, hidden, latent sizes, batch, time


def _cell(latent='lstm', **kw):
  kw = {'latent': StaticLatent, **kw} if latent == 'static' else kw
  return ALSTMCell(N, latent_size=K, **kw)


def _random_carry(cell, seed, batch=B):
  """A carry with random values (zeros would hide the h and c paths)."""
  carry = cell.initialize_carry(jax.random.key(0), (batch, M))
  leaves, tree = jax.tree.flatten(carry)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(
    tree, [rng.normal(size=x.shape).astype(np.float32) * 0.5 for x in leaves]
  )


def _init(cell, x, seed=0):
  carry = cell.initialize_carry(jax.random.key(0), x.shape)
  return perturb(cell.init(jax.random.key(seed), carry, x)['params'], seed + 1)


def _np(tree):
  return jax.tree.map(np.asarray, tree)


@pytest.mark.parametrize('latent', ['lstm', 'static'])
def test_step_matches_equation_8(latent):
  cell = _cell(latent)
  x = np.random.default_rng(0).normal(size=(B, M)).astype(np.float32)
  params = _init(cell, x)
  carry = _random_carry(cell, 1)
  new_carry, out = jax.jit(cell.apply)({'params': params}, carry, x)
  expected = alstm_step(_np(params), _np(carry), x, latent=latent)
  for got, want in zip(jax.tree.leaves(new_carry), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(out, new_carry[-1])


def test_latent_dropout_is_one_mask_per_window_kept_in_the_latent_carry():
  """The authors' dropout_adapt: z ⊙ m makes the policy and is what the latent
  LSTM carries, with one mask m per call; none without a dropout RNG."""
  from lm_zoo.models.recurrent import RecurrentLayer

  cell = ALSTMCell(N, latent_size=8, dropout_latent=0.5)
  xs = np.random.default_rng(3).normal(size=(T, 16, M)).astype(np.float32)  # 16 x 8 z's
  params = _init(cell.clone(dropout_latent=0.0), xs[0])
  carry = _random_carry(cell, 4, batch=16)
  # Each run compiled whole (op by op, every operation would compile on its own).
  layer = jax.jit(RecurrentLayer(cell).apply)
  (latent_carry, c, h), ys = layer(
    {'params': {'cell': params}}, carry, xs, rngs={'dropout': jax.random.key(5)}
  )
  z_dropped = np.asarray(latent_carry[1])
  mask = (z_dropped != 0) * 2.0  # 1 / (1 - 0.5) where kept
  assert 0.2 < (mask == 0).mean() < 0.8
  expected = _np(carry)
  for t in range(T):
    expected = alstm_step(_np(params), expected, xs[t], latent_mask=mask)
    np.testing.assert_allclose(ys[t], expected[-1], rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(c, expected[1], rtol=2e-5, atol=2e-5)
  _, ys_eval = layer({'params': {'cell': params}}, carry, xs)  # no RNG: no dropout
  plain = jax.jit(RecurrentLayer(cell.clone(dropout_latent=0.0)).apply)(
    {'params': {'cell': params}}, carry, xs
  )[1]
  np.testing.assert_array_equal(ys_eval, plain)


def test_params_are_those_of_the_paper():
  """W (m, 4n), V (n, 4n), b (4n), U (k, m + 13n) without bias, and the latent."""
  cell = _cell()
  params = cell.init(
    jax.random.key(0), cell.initialize_carry(jax.random.key(0), (B, M)), jnp.zeros((B, M))
  )['params']
  shapes = jax.tree.map(jnp.shape, params)
  assert shapes['input'] == {'kernel_1': (M, 4 * N)}
  assert shapes['recurrent'] == {'kernel_1': (N, 4 * N), 'bias': (4 * N,)}
  assert shapes['policy'] == {'kernel': (K, M + 13 * N)}
  assert shapes['latent']['recurrent_kernel'] == (K, 4 * K)
  assert shapes['latent']['input']['kernel'] == (M + N, 4 * K)
  bias = np.asarray(params['recurrent']['bias'])
  np.testing.assert_array_equal(bias, np.r_[np.zeros(N), np.ones(N), np.zeros(2 * N)])
  w = np.asarray(params['input']['kernel_1'])[:, :N]  # one gate's block: orthogonal
  np.testing.assert_allclose(w @ w.T, np.eye(M), atol=1e-5)


@pytest.mark.parametrize('param_dtype', [jnp.float32, jnp.bfloat16])
def test_w_and_v_are_orthogonal_per_gate_or_over_the_four_gates(param_dtype):
  """Per gate: each gate's block has orthonormal rows (M, N <= N). Over the
  gates, as the authors' code draws them: the whole (rows, 4N) matrix has
  orthonormal rows and the gates' blocks do not."""
  x = jnp.zeros((B, M))
  for per_gate in (True, False):
    cell = _cell(orthogonal_per_gate=per_gate, param_dtype=param_dtype)
    params = cell.init(jax.random.key(0), cell.initialize_carry(jax.random.key(0), x.shape), x)
    for name, rows in (('input', M), ('recurrent', N)):
      kernel = np.asarray(params['params'][name]['kernel_1'], np.float64)
      assert params['params'][name]['kernel_1'].dtype == param_dtype
      atol = 2e-2 if param_dtype == jnp.bfloat16 else 1e-5
      blocks = [kernel[:, g * N : (g + 1) * N] for g in range(4)]
      if per_gate:
        for block in blocks:
          np.testing.assert_allclose(block @ block.T, np.eye(rows), atol=atol)
      else:
        np.testing.assert_allclose(kernel @ kernel.T, np.eye(rows), atol=atol)
        assert not np.allclose(blocks[0] @ blocks[0].T, np.eye(rows), atol=0.1)


@pytest.mark.parametrize('latent', ['lstm', 'static'])
def test_runs_in_nn_rnn_under_jit(latent):
  cell = _cell(latent)
  xs = np.random.default_rng(2).normal(size=(B, T, M)).astype(np.float32)
  rnn = nn.RNN(cell, return_carry=True)
  variables = {'params': {'cell': _init(cell, xs[:, 0])}}
  carry, ys = jax.jit(rnn.apply)(variables, xs)
  np_carry = _np(cell.initialize_carry(jax.random.key(0), (B, M)))
  for t in range(T):
    np_carry = alstm_step(_np(variables['params']['cell']), np_carry, xs[:, t], latent=latent)
    np.testing.assert_allclose(ys[:, t], np_carry[-1], rtol=1e-4, atol=1e-5)
  bidir = nn.Bidirectional(nn.RNN(_cell(latent)), nn.RNN(_cell(latent)))
  out = jax.jit(bidir.apply)(bidir.init(jax.random.key(0), xs), xs)
  assert out.shape == (B, T, 2 * N)


def test_gradients_match_finite_differences():
  cell = _cell()
  xs = np.random.default_rng(3).normal(size=(B, 3, M))
  params = _init(cell, jnp.asarray(xs[:, 0], jnp.float32))
  with jax.enable_x64(True):
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params)
    rnn = nn.RNN(_cell(param_dtype=jnp.float64))
    loss = jax.jit(lambda p, xs: jnp.sum(rnn.apply({'params': {'cell': p}}, xs) ** 2))
    check_reverse_gradient(loss, (params, jnp.asarray(xs)), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_mogrified_alstm_mogrifies_x_and_h_then_adapts():
  cell = Mogrify(_cell(parent=None), rounds=3, rank=2)
  x = np.random.default_rng(4).normal(size=(B, M)).astype(np.float32)
  params = _init(cell, x)
  carry = _random_carry(cell, 5)
  new_carry, _ = cell.apply({'params': params}, carry, x)
  p = _np(params)
  latent_carry, c, h = _np(carry)
  x_up, h_up = mogrify(p, x, h, rounds=3)
  expected = alstm_step(p['cell'], (latent_carry, c, h_up), x_up)
  for got, want in zip(jax.tree.leaves(new_carry), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_rhn_stack_wires_latents_as_equation_9():
  cells = [_cell(parent=None), ALSTMCell(N + 1, latent_size=K, parent=None)]
  stack = LSTMRHNStack(cells)
  xs = np.random.default_rng(6).normal(size=(B, T, M)).astype(np.float32)
  rnn = nn.RNN(stack)
  variables = rnn.init(jax.random.key(0), xs)
  params = perturb(variables['params'])
  ys = jax.jit(rnn.apply)({'params': params}, xs)
  p = _np(params['cell'])
  carries = _np(stack.initialize_carry(jax.random.key(0), (B, M)))
  for t in range(T):
    top_z = carries[1][0][1]  # z^(L)_{t-1}: the top latent LSTM's h
    bottom = alstm_step(p['cells_0'], carries[0], xs[:, t], context=top_z)
    top = alstm_step(p['cells_1'], carries[1], bottom[-1], context=bottom[0][1])
    carries = (bottom, top)
    np.testing.assert_allclose(ys[:, t], top[-1], rtol=1e-4, atol=1e-5)


def test_rhn_stack_needs_recurrent_latents():
  stack = LSTMRHNStack([_cell('static', parent=None), _cell('static', parent=None)])
  with pytest.raises(ConfigError, match='recurrent latents'):
    nn.RNN(stack).init(jax.random.key(0), jnp.zeros((B, T, M)))


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: ALSTMCell(0), 'ALSTMCell: features must be a whole number >= 1, got 0'),
    (lambda: ALSTMCell(N, latent_size=-1), 'ALSTMCell: latent_size must be .* got -1'),
    (
      lambda: _cell(dropout_latent=1.5),
      r'dropout_latent must be a dropout rate in \[0, 1\), got 1.5',
    ),
    (lambda: _cell(dropout_latent=-0.5), 'dropout_latent must be a dropout rate .* got -0.5'),
    (lambda: StaticLatent(0), 'StaticLatent: features must be a whole number >= 1, got 0'),
    (lambda: LSTMRHNStack([]), 'cells must hold at least one ALSTMCell layer'),
    (lambda: LSTMRHNStack([_cell()], dropout_state=-1.0), 'dropout_state must be a dropout rate'),
    (lambda: LSTMRHNStack([_cell()], dropout_hidden=1.0), 'dropout_hidden must be a dropout rate'),
    (
      lambda: ALSTMCell(N, latent=LSTMCell(4, parent=None)),
      'ALSTMCell: latent must be a cell constructor .* got LSTMCell',
    ),
    (lambda: ALSTMCell(N, latent='lstm'), "latent must be a cell constructor .* got 'lstm'"),
    (
      lambda: LSTMRHNStack([_cell(parent=None), LSTMCell(N, parent=None)]),
      'LSTMRHNStack: cells must be ALSTMCell layers, and layer 1 is LSTMCell',
    ),
  ],
  ids=[
    'features',
    'latent_size',
    'rate 1.5',
    'rate -0.5',
    'static',
    'no layers',
    'state',
    'hidden',
    'latent instance',
    'latent name',
    'plain layer',
  ],
)
def test_a_size_or_rate_out_of_range_is_refused_on_construction(make, message):
  """Not at the first call, deep in JAX, nor silently: flax's nn.Dropout
  drops everything at a rate above 1 and scales every value down below 0."""
  with pytest.raises(ValueError, match=message):
    make()


@pytest.mark.parametrize(
  'carry',
  [
    lambda c, h: (c, h),
    lambda c, h: ((), c[:, :1], h),
    lambda c, h: ((), c, h[:1]),
  ],
  ids=['no latent carry', 'c of width 1', 'h of another batch'],
)
def test_a_carry_that_is_not_its_own_is_refused_naming_the_shapes(carry):
  """Called as a cell, outside a layer: a c of width 1 broadcast against the
  gates and ran on, silently; a (c, h) pair failed to unpack."""
  cell = _cell('static')
  x = jnp.zeros((B, M))
  _, c, h = cell.initialize_carry(jax.random.key(0), x.shape)
  params = cell.init(jax.random.key(0), ((), c, h), x)
  with pytest.raises(
    ValueError, match=rf'carry must be \(latent carry, c, h\), c and h arrays of shape \({B}, {N}\)'
  ):
    cell.apply(params, carry(c, h), x)


@pytest.mark.parametrize('latent', ['lstm', 'static'])
def test_parameter_count_formula(latent):
  cell = _cell(latent)
  params = cell.init(
    jax.random.key(0), cell.initialize_carry(jax.random.key(0), (B, M)), jnp.zeros((B, M))
  )['params']
  v = M + N  # the latent model's input [x; h]
  latent_count = 4 * K * (v + K) + 4 * K if latent == 'lstm' else v * K + K
  expected = 4 * N * (M + N) + 4 * N + K * (M + 13 * N) + latent_count
  assert sum(x.size for x in jax.tree.leaves(params)) == expected


@pytest.mark.parametrize('latent', ['lstm', 'static', 'lstm_rhn'])
def test_alstm_language_model_from_config(latent):
  cfg = base_config().model
  cfg.update(cell='alstm', embed_size=6, hidden_size=7, dropout_state=0.2, dropout_hidden=0.2)
  cfg.alstm.update(latent=latent, latent_size=4)
  model = build_model(cfg, 20)
  params = init_params(model, jax.random.key(0))
  assert params['stack']['cell_1']['policy']['kernel'].shape == (4, 7 + 13 * 7)
  tokens = jnp.ones((2, 5), jnp.int32)

  def loss(p):
    logits, _ = model.apply(
      {'params': p},
      tokens,
      model.initialize_carry(2),
      train=True,
      rngs={'dropout': jax.random.key(1)},
    )
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 1])

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  assert np.isfinite(value)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert np.abs(grads['stack']['cell_0']['policy']['kernel']).sum() > 0  # the policies learn
  cfg.alstm.latent = 'hyper'
  with pytest.raises(ConfigError, match="model.alstm.latent='hyper' is not known"):
    build_model(cfg, 20)


def _rhn_lm_config():
  cfg = base_config().model
  cfg.update(cell='alstm', embed_size=6, hidden_size=7)
  cfg.alstm.update(latent='lstm_rhn', latent_size=4)
  return cfg


def test_lstm_rhn_language_model_steps_the_rhn_stack():
  model = build_model(_rhn_lm_config(), 20)
  params = perturb(init_params(model, jax.random.key(0)))
  # The bottom latent sees [x; h; z of the top layer]: 6 + 7 + 4 inputs.
  assert params['stack']['cell_0']['latent']['input']['kernel'].shape[0] == 6 + 7 + 4
  tokens = jnp.asarray(np.random.default_rng(7).integers(0, 20, (B, T)))
  # Both sides compiled whole: op by op, every operation would compile on its own.
  logits, carries = jax.jit(model.apply)({'params': params}, tokens, model.initialize_carry(B))
  stack = LSTMRHNStack([ALSTMCell(7, latent_size=4, parent=None) for _ in range(2)])
  x = np.asarray(params['embedding']['embedding'])[np.asarray(tokens)]
  last, h = jax.jit(nn.RNN(stack, return_carry=True).apply)(
    {
      'params': {
        'cell': {'cells_0': params['stack']['cell_0'], 'cells_1': params['stack']['cell_1']}
      }
    },
    x,
  )
  expected = np.asarray(h) @ np.asarray(params['head']['kernel']).T + np.asarray(
    params['head']['bias']
  )
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree.leaves(carries), jax.tree.leaves(last)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lstm_rhn_dropout_is_off_at_evaluation_and_on_in_training():
  cfg = _rhn_lm_config()
  cfg.update(dropout_hidden=0.3, dropout_state=0.3)
  model = build_model(cfg, 20)
  params = perturb(init_params(model, jax.random.key(0)), scale=1.0)
  tokens = jnp.ones((B, T), jnp.int32)
  # Compiled whole: op by op, every operation would compile on its own.
  apply = jax.jit(
    lambda model, train, key: model.apply(
      {'params': params},
      tokens,
      model.initialize_carry(B),
      train=train,
      rngs=None if key is None else {'dropout': jax.random.key(key)},
    )[0],
    static_argnums=(0, 1),
  )
  run = lambda train, key=1: apply(model, train, key)
  undropped = apply(build_model(_rhn_lm_config(), 20), True, None)
  np.testing.assert_allclose(run(False), undropped, rtol=1e-6)
  assert not np.allclose(run(True), undropped, atol=0.1)
  np.testing.assert_array_equal(run(True), run(True))  # one mask per key


@pytest.mark.parametrize(
  'field, value, match',
  [
    ('mogrifier.rounds', 2, 'Mogrifier rounds'),
    ('variational_dropout', False, 'variational dropout only'),
    ('skip_connections', True, 'no skip connections'),
  ],
)
def test_lstm_rhn_rejects_what_it_cannot_wire(field, value, match):
  cfg = _rhn_lm_config()
  section, _, name = field.rpartition('.')
  (cfg[section] if section else cfg)[name] = value
  with pytest.raises(ConfigError, match=match):
    build_model(cfg, 20)
  if field == 'skip_connections':  # the LSTM-RHN stack has none to set
    cfg.skip_connections = False
    stack = build_model(cfg, 20).stack
    with pytest.raises(TypeError, match='skip_connections'):
      dataclasses.replace(stack, skip_connections=True)
