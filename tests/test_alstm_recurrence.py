"""The aLSTM's fused window (`alstm_recurrence`) against the step-by-step
'scan' path: outputs, final carry and every gradient, float32 and bfloat16,
and one weight's gradient against finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import alstm_window_inputs, perturb
from jaxprs import summed_sizes_in_loops

from lm_zoo.cells import ALSTMCell, LSTMCell, StaticLatent, resolve_scan
from lm_zoo.cells.alstm_recurrence import alstm_recurrence
from lm_zoo.cells.window_kernels import alstm_window
from lm_zoo.layers.products import aligned_contractions
from lm_zoo.models import RecurrentLayer

M, N, K, B, T = 3, 4, 5, 2, 6
LATENTS = {'recurrent': LSTMCell, 'static': StaticLatent}


def _window(cell, seed=1):
  return alstm_window_inputs(cell, B, M, N, T, seed)


def _loss(out):
  carry, hs = out
  return jnp.sum(jnp.sin(hs)) + sum(
    jnp.sum(jnp.cos(leaf) * (k + 1)) for k, leaf in enumerate(jax.tree.leaves(carry))
  )


def _both(cell, seed=1):
  """The scan path and the fused window as functions of (params, carry, xs, mask)."""
  carry, xs, mask = _window(cell, seed)
  params = perturb(
    RecurrentLayer(cell, scan='scan').init(jax.random.key(0), carry, xs, mask)['params']
  )['cell']
  scanned = lambda p, c, x, k: RecurrentLayer(cell, scan='scan').apply(
    {'params': {'cell': p}}, c, x, k
  )
  fused = lambda p, c, x, k: RecurrentLayer(cell, scan='fused').apply(
    {'params': {'cell': p}}, c, x, k
  )
  return scanned, fused, (params, carry, xs, mask)


def _assert_close(got, want, rtol, atol):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


@pytest.mark.parametrize('cap', [False, True], ids=['plain', 'capped'])
@pytest.mark.parametrize('latent', LATENTS.values(), ids=LATENTS.keys())
def test_fused_window_equals_the_scan_in_values_and_every_gradient(latent, cap):
  cell = ALSTMCell(N, latent=latent, latent_size=K, cap_input_gate=cap)
  scanned, fused, args = _both(cell)
  _assert_close(fused(*args), scanned(*args), 1e-5, 1e-6)
  grad = lambda run: jax.jit(jax.grad(lambda *a: _loss(run(*a)), argnums=(0, 1, 2, 3)))(*args)
  _assert_close(grad(fused), grad(scanned), 1e-5, 1e-6)


def test_aligned_weights_give_the_scan_in_values_and_every_gradient():
  """63 inputs, units and latent units, every weight padded before the
  loops to a multiple of 64 rows: then every product inside the forward and
  backward loops sums over a multiple of 64 (v: 126 -> 128, gates: 252 ->
  256, the policy's 882 -> 896), and values and gradients are the scan's."""
  cell = ALSTMCell(63, latent_size=63)
  carry, xs, mask = alstm_window_inputs(cell, 2, 63, 63, 3)
  params = perturb(cell.init(jax.random.key(0), carry, xs[0])['params'])
  scanned = lambda p, c, x, k: RecurrentLayer(cell, scan='scan').apply(
    {'params': {'cell': p}}, c, x, k
  )
  fused = lambda p, c, x, k: alstm_recurrence(x, p, c, k)
  grad = lambda run: jax.grad(lambda *a: _loss(run(*a)), argnums=(0, 1, 2, 3))
  args = (params, carry, xs, mask)
  with aligned_contractions(64):
    sizes = summed_sizes_in_loops(jax.make_jaxpr(grad(fused))(*args).jaxpr)
    got = jax.jit(fused)(*args), jax.jit(grad(fused))(*args)
  assert sorted(set(sizes)) == [64, 128, 256, 896]
  want = jax.jit(scanned)(*args), jax.jit(grad(scanned))(*args)
  # float32 sums of 63 to 882 terms: within 1e-5 of each array's largest entry
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(
      g, w, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(w)))
    ),
    got,
    want,
  )


@pytest.mark.parametrize('latent', LATENTS.values(), ids=LATENTS.keys())
def test_bfloat16_products_agree_with_the_scan_within_their_rounding(latent):
  cell = ALSTMCell(N, latent=latent, latent_size=K, dtype=jnp.bfloat16)
  scanned, fused, args = _both(cell)
  _assert_close(fused(*args), scanned(*args), 2e-2, 2e-2)
  grad = lambda run: jax.jit(jax.grad(lambda *a: _loss(run(*a)), argnums=(0, 1, 2, 3)))(*args)
  got, want = grad(fused), grad(scanned)
  # Every gradient within bfloat16's rounding of the largest entry of its array.
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, atol=3e-2 * float(jnp.max(jnp.abs(w))) + 1e-3),
    got,
    want,
  )


def test_a_policy_weight_gradient_matches_finite_differences():
  cell = ALSTMCell(N, latent_size=K, cap_input_gate=True)
  carry, xs, mask = _window(cell)
  params = perturb(cell.init(jax.random.key(0), carry, xs[0])['params'])
  with jax.enable_x64():  # float64 throughout, so that the differences resolve the slope
    wide = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree)
    params, carry, xs, mask = wide((params, carry, xs, mask))
    kernel = params['policy']['kernel']

    def loss(value, entry):
      p = {**params, 'policy': {'kernel': kernel.at[entry].set(value)}}
      return _loss(alstm_window(cell, p, carry, xs, mask))

    loss = jax.jit(loss, static_argnums=1)
    grads = jax.grad(lambda k: loss(k, ...))(kernel)
    entry = np.unravel_index(int(jnp.argmax(jnp.abs(grads))), kernel.shape)
    eps = 1e-5
    numeric = (loss(kernel[entry] + eps, entry) - loss(kernel[entry] - eps, entry)) / (2 * eps)
    np.testing.assert_allclose(grads[entry], numeric, rtol=1e-6)


def test_window_of_explicit_parameters_unrolled_matches_the_layer():
  cell = ALSTMCell(N, latent_size=K)
  scanned, _, (params, carry, xs, mask) = _both(cell)
  direct = lambda p, c, x, k: alstm_recurrence(x, p, c, k, unroll=4)
  _assert_close(direct(params, carry, xs, mask), scanned(params, carry, xs, mask), 1e-5, 1e-6)
  grad = lambda run: jax.jit(jax.grad(lambda *a: _loss(run(*a)), argnums=(0, 1, 2, 3)))(
    params, carry, xs, mask
  )
  _assert_close(grad(direct), grad(scanned), 1e-5, 1e-6)


def test_latent_dropout_is_refused_for_the_window_kernels_and_auto_scans():
  cell = ALSTMCell(N, latent_size=K, dropout_latent=0.2)
  with pytest.raises(ValueError, match="scan='fused' cannot run ALSTMCell.*dropout_latent"):
    resolve_scan(cell, 'fused')
  assert resolve_scan(cell, 'auto') == 'scan'
  other_latent = ALSTMCell(
    N, latent_size=K, latent=lambda **kw: LSTMCell(cap_input_gate=True, **kw)
  )
  assert resolve_scan(other_latent, 'auto') == 'scan'  # no kernel for other latents


def test_a_layer_dropping_its_latent_scans_in_training_and_runs_the_window_in_evaluation():
  cell = ALSTMCell(N, latent_size=K, dropout_latent=0.5)
  carry, xs, _ = _window(cell)
  params = perturb(cell.init(jax.random.key(0), carry, xs[0])['params'])
  run = lambda scan, **rngs: RecurrentLayer(cell, scan=scan).apply(
    {'params': {'cell': params}}, carry, xs, rngs=rngs
  )
  np.testing.assert_array_equal(run('auto')[1], run('fused')[1])  # no RNG: nothing dropped
  with pytest.raises(ValueError, match='dropout_latent draws its mask'):
    run('fused', dropout=jax.random.key(1))
  np.testing.assert_array_equal(
    run('auto', dropout=jax.random.key(1))[1], run('scan', dropout=jax.random.key(1))[1]
  )
