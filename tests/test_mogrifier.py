"""Mogrify, LowRankDense and MLSTMCell against their equations in NumPy, and
the rounds' hand-written backward pass against autodiff."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturb
from numpy_reference import linear, lstm_step, mogrify

from lm_zoo.cells import ALSTMCell, LSTMCell, LSTMRHNStack, MLSTMCell, Mogrify, resolve_scan
from lm_zoo.cells.mogrifier import MogrifierRounds
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.layers import LowRankDense
from lm_zoo.models import build_model, count_params, init_params, solve_hidden_size
from lm_zoo.models.recurrent import RecurrentLayer

M, N, B = 5, 7, 3  # input size, hidden size, batch


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  return tuple(rng.normal(size=(B, d)).astype(np.float32) for d in (N, N, M))


def _init(cell, seed=0):
  carry = cell.initialize_carry(jax.random.key(0), (B, M))
  return perturb(cell.init(jax.random.key(seed), carry, jnp.zeros((B, M)))['params'], seed + 1)


@pytest.mark.parametrize('rank', [0, 3])
@pytest.mark.parametrize('rounds', [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize('zigzag', [True, False])
def test_mogrified_lstm_matches_equations(rounds, rank, zigzag):
  cell = Mogrify(LSTMCell(N), rounds=rounds, rank=rank, zigzag=zigzag)
  params = _init(cell, seed=rounds)
  c, h, x = _inputs(rounds)
  (c_new, h_new), out = jax.jit(cell.apply)({'params': params}, (c, h), x)
  x_up, h_up = mogrify(params, x, h, rounds, zigzag)
  c_ref, h_ref = lstm_step(params['cell'], c, h_up, x_up)
  np.testing.assert_allclose(c_new, c_ref, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(h_new, h_ref, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(out, h_new)


@pytest.mark.parametrize('inner', ['lstm', 'mlstm'])
def test_capped_input_gate_inside_mogrify_matches_equations(inner):
  """lamb's published Mogrifier configs: rounds, then c' = f c + min(1 - f, i) j."""
  base = LSTMCell(N, cap_input_gate=True) if inner == 'lstm' else MLSTMCell(N, cap_input_gate=True)
  cell = Mogrify(base, rounds=5, rank=3)
  params = _init(cell, seed=2)
  c, h, x = _inputs(2)
  (c_new, h_new), _ = jax.jit(cell.apply)({'params': params}, (c, h), x)
  x_up, h_up = mogrify(params, x, h, 5)
  inner_params = params['cell']
  if inner == 'mlstm':
    h_up = (x_up @ np.asarray(inner_params['mx']['kernel'])) * (
      h_up @ np.asarray(inner_params['mh']['kernel'])
    )
    inner_params = inner_params['lstm']
  c_ref, h_ref = lstm_step(inner_params, c, h_up, x_up, cap_input_gate=True)
  np.testing.assert_allclose(c_new, c_ref, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(h_new, h_ref, rtol=2e-5, atol=2e-5)
  c_plain, _ = lstm_step(inner_params, c, h_up, x_up)
  assert not np.allclose(c_ref, c_plain)  # the cap binds for some units


def test_zigzag_and_no_zigzag_differ_from_round_two():
  c, h, x = _inputs()
  outs = {}
  for zigzag in (True, False):
    cell = Mogrify(LSTMCell(N), rounds=3, zigzag=zigzag)
    outs[zigzag] = jax.jit(cell.apply)({'params': _init(cell)}, (c, h), x)[1]
  assert not np.allclose(outs[True], outs[False])


def test_zero_rounds_is_the_inner_cell():
  c, h, x = _inputs()
  inner = LSTMCell(N)
  params = _init(inner)
  wrapped = Mogrify(LSTMCell(N), rounds=0)
  expected = inner.apply({'params': params}, (c, h), x)
  got = wrapped.apply({'params': {'cell': params}}, (c, h), x)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
  'make, message',
  [
    (
      lambda: Mogrify(LSTMCell(N), rank=2.5),
      r'Mogrify: rank must be an integer \(<= 0: full rank\), got 2.5',
    ),
    (lambda: Mogrify(LSTMCell(N), rank='4'), "Mogrify: rank must be an integer .* got '4'"),
    (
      lambda: Mogrify(LSTMCell(N), rounds=True),
      'Mogrify: rounds must be an integer >= 0 .* got True',
    ),
    (
      lambda: Mogrify(LSTMCell, rounds=2),
      'Mogrify: cell must be a cell instance, such as LSTMCell',
    ),
    (lambda: MogrifierRounds(0), 'MogrifierRounds: rounds must be an integer >= 1 .* got 0'),
    (lambda: MogrifierRounds(2.5), 'MogrifierRounds: rounds must be an integer >= 1 .* got 2.5'),
  ],
  ids=['rank 2.5', "rank '4'", 'rounds True', 'cell class', 'mix of 0 rounds', 'mix of 2.5'],
)
def test_a_wrong_rank_rounds_or_cell_is_refused_on_construction(make, message):
  """Not at the first call, as a TypeError deep in JAX or flax (a fractional
  rank, a cell class) or a concatenation of no arrays (a mix of no rounds)."""
  with pytest.raises(ValueError, match=message):
    make()


def test_a_cell_whose_carry_does_not_end_in_its_output_is_refused():
  """The LSTM-RHN stack carries its layers' carries: the rounds cannot gate
  them, and say so rather than fail on a tuple's missing shape."""
  stack = LSTMRHNStack([ALSTMCell(4, parent=None), ALSTMCell(4, parent=None)])
  cell = Mogrify(stack, rounds=2)
  carry = stack.initialize_carry(jax.random.key(0), (2, 3))
  refused = 'Mogrify: the inner cell LSTMRHNStack does not carry its output h'
  with pytest.raises(ValueError, match=refused):
    cell.init(jax.random.key(1), carry, jnp.ones((2, 3)))


@pytest.mark.parametrize('rank', [0, 2])
def test_zero_mogrifier_weights_give_the_inner_cell(rank):
  c, h, x = _inputs()
  cell = Mogrify(LSTMCell(N), rounds=5, rank=rank)
  params = _init(cell)
  zeroed = {k: (v if k == 'cell' else jax.tree.map(jnp.zeros_like, v)) for k, v in params.items()}
  got = jax.jit(cell.apply)({'params': zeroed}, (c, h), x)[1]
  expected = jax.jit(LSTMCell(N).apply)({'params': params['cell']}, (c, h), x)[1]
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)  # 2σ(0) = 1


@pytest.mark.parametrize('rounds, rank', [(1, 0), (4, 0), (5, 3), (6, 2)])
def test_parameter_count_formula(rounds, rank):
  cell = Mogrify(LSTMCell(N), rounds=rounds, rank=rank)
  params = _init(cell)
  lstm = 4 * N * (M + N) + 4 * N
  n_q, n_r = (rounds + 1) // 2, rounds // 2
  if rank > 0:
    q, r = N * rank + rank * M + M, M * rank + rank * N + N
  else:
    q, r = N * M + M, M * N + N
  assert sum(p.size for p in jax.tree.leaves(params)) == lstm + n_q * q + n_r * r


@pytest.mark.parametrize('inner', [nn.GRUCell(N), nn.SimpleCell(N)], ids=['gru', 'simple'])
def test_other_cells_see_the_mogrified_inputs(inner):
  _, h, x = _inputs()
  cell = Mogrify(inner, rounds=4, rank=2)
  params = _init(cell)
  x_up, h_up = mogrify(params, x, h, 4)
  got = jax.jit(cell.apply)({'params': params}, h, x)[1]
  expected = jax.jit(inner.apply)({'params': params['cell']}, jnp.asarray(h_up), jnp.asarray(x_up))[
    1
  ]
  np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def test_mlstm_matches_equations():
  c, h, x = _inputs()
  cell = MLSTMCell(N)
  params = _init(cell)
  (c_new, h_new), _ = jax.jit(cell.apply)({'params': params}, (c, h), x)
  h_m = (x @ np.asarray(params['mx']['kernel'])) * (h @ np.asarray(params['mh']['kernel']))
  c_ref, h_ref = lstm_step(params['lstm'], c, h_m, x)
  np.testing.assert_allclose(c_new, c_ref, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(h_new, h_ref, rtol=2e-5, atol=2e-5)


def test_low_rank_dense():
  x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
  layer = LowRankDense(32, rank=8)
  params = layer.init(jax.random.key(0), x)['params']
  assert params['kernel_in'].shape == (64, 8) and params['kernel_out'].shape == (8, 32)
  np.testing.assert_array_equal(params['bias'], 0)
  np.testing.assert_allclose(
    layer.apply({'params': params}, x), linear(params, x), rtol=1e-5, atol=1e-5
  )
  # lamb: factors ~ truncated_normal(s = (1/(m k))^(1/4)), cut at ±2s unrescaled
  big = LowRankDense(256, rank=16).init(jax.random.key(1), jnp.zeros((1, 512)))['params']
  s = (1 / (512 * 16)) ** 0.25
  factor = np.asarray(big['kernel_in'])
  assert np.abs(factor).max() <= 2 * s
  truncated_var = 0.7737413  # variance of N(0, 1) conditioned on |z| <= 2
  assert abs(factor.var() / (s * s * truncated_var) - 1) < 0.05
  product = np.asarray(big['kernel_in'] @ big['kernel_out'])
  assert abs(product.var() * 512 / truncated_var**2 - 1) < 0.1
  full = LowRankDense(32, rank=0).init(jax.random.key(0), x)['params']
  assert set(full) == {'kernel', 'bias'}


def _mogrifier_model_config(**kw):
  cfg = base_config().model
  cfg.update(
    embed_size=12, hidden_size=12, tie_embeddings=True, dropout_input=0.2, dropout_state=0.2
  )
  cfg.mogrifier.update(rounds=5, rank=3)
  cfg.update(kw)
  return cfg


def test_mogrifier_language_model_under_jit_and_grad():
  model = build_model(_mogrifier_model_config(), 40)
  params = init_params(model, jax.random.key(0))
  assert set(params['stack']['cell_0']) == {'cell', 'q1', 'r2', 'q3', 'r4', 'q5'}
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 6)), jnp.int32)

  def loss(p):
    logits, _ = model.apply(
      {'params': p},
      tokens,
      model.initialize_carry(2),
      train=True,
      rngs={'dropout': jax.random.key(0)},
    )
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  grads = jax.jit(jax.grad(loss))(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert np.abs(grads['stack']['cell_0']['q1']['kernel_in']).sum() > 0


def test_solve_hidden_size_fits_the_budget():
  cfg = _mogrifier_model_config(embed_size=0)
  budget = 120_000
  n = solve_hidden_size(cfg, 1000, budget)
  count = lambda size: count_params(build_model(_with(cfg, hidden_size=size), 1000))
  assert count(n) <= budget < count(n + 1)
  model = build_model(_with(cfg, param_budget=budget), 1000)
  assert [mogrify.cell.features for mogrify in model.stack.cells] == [n, n]
  with pytest.raises(ConfigError, match='below the smallest model'):
    solve_hidden_size(cfg, 1000, 10)


def _with(cfg, **kw):
  cfg = cfg.copy_and_resolve_references()
  cfg.update(kw)
  return cfg


@pytest.mark.parametrize('rounds, rank, zigzag', [(4, 3, True), (5, 2, False), (6, 0, False)])
def test_rounds_backward_and_parameter_gradient_equal_autodiff(rounds, rank, zigzag):
  cell = Mogrify(LSTMCell(N), rounds=rounds, rank=rank, zigzag=zigzag)
  # Drawn in float32, as the other tests' parameters of these shapes (whose
  # initialisers are compiled already), then widened.
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), _init(cell, seed=rounds))
  with jax.enable_x64():
    round_params = {k: v for k, v in params.items() if k != 'cell'}
    rng = np.random.default_rng(rounds)
    steps = 4
    xs, hs = rng.normal(size=(steps, B, M)), rng.normal(size=(steps, B, N))
    d_xs, d_hs = rng.normal(size=(steps, B, M)), rng.normal(size=(steps, B, N))
    mix = MogrifierRounds(rounds, zigzag)
    # Each piece compiled whole: op by op, every operation would compile on its own.
    forward, backward = jax.jit(mix.forward), jax.jit(mix.backward)
    d_x_got, d_h_got, residuals, stashes = [], [], [], []
    for x, h, d_x, d_h in zip(xs, hs, d_xs, d_hs):
      x_up, h_up, kept = forward(round_params, x, h)
      np.testing.assert_allclose(
        np.concatenate([x_up, h_up], -1),
        np.concatenate(mogrify(params, x, h, rounds, zigzag), -1),
        rtol=1e-12,
      )
      dx, dh, stash = backward(round_params, x, h, kept, d_x, d_h)
      d_x_got.append(dx), d_h_got.append(dh), residuals.append(kept), stashes.append(stash)
    d_params = jax.jit(mix.params_gradient)(
      round_params, xs, hs, np.stack(residuals), np.stack(stashes)
    )

    def pullback(p, x, h, d_x, d_h):
      return jax.vjp(lambda *a: mix.forward(*a)[:2], p, x, h)[1]((d_x, d_h))

    want = jax.jit(jax.vmap(pullback, in_axes=(None, 0, 0, 0, 0)))(round_params, xs, hs, d_xs, d_hs)
    np.testing.assert_allclose(np.stack(d_x_got), want[1], rtol=1e-10)
    np.testing.assert_allclose(np.stack(d_h_got), want[2], rtol=1e-10)
    jax.tree.map(
      lambda g, w: np.testing.assert_allclose(g, w.sum(0), rtol=1e-10, atol=1e-12),
      d_params,
      want[0],
    )


@pytest.mark.parametrize(
  'rank, zigzag, cap, two_biases',
  [(0, True, False, False), (2, False, False, True), (3, True, True, False)],
)
def test_window_scan_equals_the_step_by_step_scan(rank, zigzag, cap, two_biases):
  cell = Mogrify(
    LSTMCell(N, cap_input_gate=cap, recurrent_bias=two_biases), rounds=5, rank=rank, zigzag=zigzag
  )
  assert resolve_scan(cell, 'auto') == 'fused'
  xs = jax.random.normal(jax.random.key(1), (6, B, M))
  carry = (
    jax.random.normal(jax.random.key(2), (B, N)),
    jnp.tanh(jax.random.normal(jax.random.key(3), (B, N))),
  )
  mask = jax.random.bernoulli(jax.random.key(4), 0.7, (B, N)) / 0.7
  init = lambda scan: RecurrentLayer(cell, scan=scan).init(jax.random.key(0), carry, xs, mask)[
    'params'
  ]
  params = init('fused')
  jax.tree.map(np.testing.assert_array_equal, params, init('scan'))  # same parameters
  params = perturb(params)

  def run(p, scan):
    (c, h), out = RecurrentLayer(cell, scan=scan).apply({'params': p}, carry, xs, mask)
    return jnp.sum(jnp.sin(out)) + jnp.sum(c**2) + jnp.sum(h), out

  # Both sides compiled whole, the same way.
  value_and_grad = jax.jit(jax.value_and_grad(run, has_aux=True), static_argnums=1)
  (loss, out), grads = value_and_grad(params, 'fused')
  (loss_ref, out_ref), grads_ref = value_and_grad(params, 'scan')
  np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-6)
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5), grads, grads_ref
  )
