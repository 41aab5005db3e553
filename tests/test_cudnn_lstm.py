"""scan='cudnn': our LSTM's parameters packed as cuDNN's, run here through
jax.experimental.rnn's reference scan, against the plain scan; the refusals;
what 'auto' picks; the layouts its GPU lowering pins."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import rnn
from jax.extend.core import Primitive
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo
from jax.interpreters import mlir

from lm_zoo.cells import LSTMCell, Mogrify, resolve_scan
from lm_zoo.cells.cudnn_lstm import cudnn_lstm_window, pack_weights, pin_row_major
from lm_zoo.models import RecurrentLayer

M, N, B, T = 3, 5, 2, 6


def _params(cell, seed=0):
  xs = jnp.ones((T, B, M))
  carry = cell.initialize_carry(jax.random.key(0), (B, M))
  params = RecurrentLayer(cell, scan='scan').init(jax.random.key(seed), carry, xs)['params']
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(
    tree, [p + 0.2 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
  )  # nonzero biases


def test_packed_weights_unpack_to_our_matrices_transposed():
  params = _params(LSTMCell(N, recurrent_bias=True))['cell']
  w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(pack_weights(params), M, N, 1, False)
  np.testing.assert_array_equal(w_ih[0], params['input']['kernel'].T)
  np.testing.assert_array_equal(w_hh[0], params['recurrent_kernel'].T)
  np.testing.assert_array_equal(b_ih[0], params['input']['bias'])
  np.testing.assert_array_equal(b_hh[0], params['recurrent_bias'])


@pytest.mark.parametrize('recurrent_bias', [False, True])
def test_the_window_and_its_gradients_equal_the_plain_scans(recurrent_bias):
  cell = LSTMCell(N, recurrent_bias=recurrent_bias)
  params = _params(cell)
  rng = np.random.default_rng(1)
  xs = jnp.asarray(rng.normal(size=(T, B, M)), jnp.float32)
  carry = tuple(jnp.asarray(rng.normal(size=(B, N)), jnp.float32) for _ in range(2))

  def loss(p, scan):
    (c, h), out = RecurrentLayer(cell, scan=scan).apply({'params': p}, carry, xs)
    return jnp.sum(jnp.sin(out)) + jnp.sum(c**2) + jnp.sum(h), out

  (want, want_out), want_grads = jax.value_and_grad(loss, has_aux=True)(params, 'scan')
  (got, got_out), got_grads = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(
    params, 'cudnn'
  )
  np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-6)
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got_grads, want_grads
  )


@pytest.mark.parametrize(
  'cell, reason',
  [
    (LSTMCell(N, cap_input_gate=True), 'no capped input gate'),
    (LSTMCell(N, dtype=jnp.bfloat16), 'float32 products only, not bfloat16'),
    (Mogrify(LSTMCell(N), rounds=2), "choose one of 'auto', 'scan', 'fused', 'pallas', 'remat'"),
    (nn.GRUCell(N), "choose one of 'auto', 'scan', 'remat'"),
  ],
)
def test_a_layer_cudnn_cannot_run_is_refused_with_the_reason(cell, reason):
  with pytest.raises(ValueError, match=reason):
    resolve_scan(cell, 'cudnn')


def test_a_masked_state_is_refused():
  with pytest.raises(ValueError, match='cannot mask the fed-back state'):
    resolve_scan(LSTMCell(N), 'cudnn', state_mask=True)
  with pytest.raises(ValueError, match='cannot mask the fed-back state'):
    cudnn_lstm_window(
      LSTMCell(N),
      _params(LSTMCell(N))['cell'],
      (jnp.zeros((B, N)),) * 2,
      jnp.ones((T, B, M)),
      jnp.ones((B, N)),
    )


@pytest.mark.parametrize(
  'inputs, carry, steps, message',
  [
    ((T, B, M - 1), (B, N), None, r"params\['input'\]\['kernel'\] is \(3, 20\), but inputs"),
    ((T, B, M), (B + 1, N), None, r"the carry's c is \(3, 5\), but inputs \(6, 2, 3\)"),
    ((T, B, M), (B, N + 1), None, r"the carry's c is \(2, 6\).* need \(2, 5\)"),
    ((B, M), (B, N), None, r'inputs must be \(T, B, m\), time first, got \(2, 3\)'),
    ((T, B, M), (B, N), T + 2, "steps must mark each of the window's 6 steps"),
  ],
  ids=['narrower inputs', 'carry batch', 'carry width', 'one step', 'steps'],
)
def test_inputs_carry_and_steps_that_do_not_fit_the_layer_are_refused(
  inputs, carry, steps, message
):
  """Not silently: cuDNN (and its reference scan) read the flat weights by
  the inputs' width, so narrower inputs ran on the wrong weights."""
  cell = LSTMCell(N)
  with pytest.raises(ValueError, match=message):
    cudnn_lstm_window(
      cell,
      _params(cell)['cell'],
      (jnp.zeros(carry),) * 2,
      jnp.ones(inputs),
      steps=None if steps is None else jnp.ones(steps, bool),
    )


@pytest.mark.parametrize('backend', ['cpu', 'gpu'])
def test_auto_takes_the_fused_window_on_every_backend(monkeypatch, backend):
  """'cudnn' is taken by name only, until its pinned layouts are checked on a GPU."""
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  assert resolve_scan(LSTMCell(N), 'auto') == 'fused'
  assert resolve_scan(Mogrify(LSTMCell(N), rounds=0), 'auto') == 'fused'
  assert resolve_scan(LSTMCell(N), 'auto', state_mask=True) == 'fused'
  assert resolve_scan(LSTMCell(N, cap_input_gate=True), 'auto') == 'fused'
  assert resolve_scan(Mogrify(LSTMCell(N), rounds=2), 'auto') == 'fused'


def test_the_pinned_lowering_gives_its_custom_call_row_major_layouts():
  """pin_row_major on a rule that leaves its custom call's layouts free (as
  jaxlib's lowering of cuDNN's LSTM does): the lowered call names the
  row-major layout of every operand and result, rank by rank."""

  def free_layouts(ctx, x, lengths):
    return stablehlo.CustomCallOp(
      [x.type, lengths.type], [x, lengths], call_target_name=ir.StringAttr.get('lm_zoo_test_target')
    ).results

  primitive = Primitive('lm_zoo_test_pinned')
  primitive.multiple_results = True
  primitive.def_abstract_eval(lambda x, lengths: (x, lengths))
  mlir.register_lowering(primitive, pin_row_major(free_layouts))
  text = (
    jax.jit(primitive.bind).trace(jnp.ones((B, T, M)), jnp.ones((B,), jnp.int32)).lower().as_text()
  )
  call = next(line for line in text.splitlines() if 'lm_zoo_test_target' in line)
  layouts = 'dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>'
  assert f'operand_layouts = [{layouts}]' in call
  assert f'result_layouts = [{layouts}]' in call


def test_a_stack_of_seeds_runs_one_call_per_seed_with_each_seeds_gradients():
  """cuDNN's primitives have no batching rule: under vmap the window loops
  over the mapped axis, forward and back, and equals each seed alone."""
  cell = LSTMCell(N)
  stacked = jax.tree.map(lambda *p: jnp.stack(p), _params(cell, 0), _params(cell, 5))
  xs = jax.random.normal(jax.random.key(3), (T, B, M))
  carry = (jnp.zeros((B, N)), jnp.zeros((B, N)))

  def loss(p, scan):
    (c, h), out = RecurrentLayer(cell, scan=scan).apply({'params': p}, carry, xs)
    return jnp.sum(jnp.sin(out)) + jnp.sum(c**2)

  got = jax.jit(jax.vmap(jax.grad(lambda p: loss(p, 'cudnn'))))(stacked)
  want = jax.vmap(jax.grad(lambda p: loss(p, 'scan')))(stacked)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)
  jaxpr = str(jax.make_jaxpr(jax.vmap(jax.grad(lambda p: loss(p, 'cudnn'))))(stacked))
  assert 'custom_vmap' in jaxpr
