"""scan='pallas' for the aLSTM: the window (its kernels interpreted on the
CPU) against the step-by-step 'scan' path, values and every gradient, with
the state mask, float32 and bfloat16; the refusals; and the kernels lowered
for NVIDIA GPUs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import alstm_window_inputs, lower_for_cuda, perturb
from jaxprs import pallas_grids

from lm_zoo.cells import ALSTMCell, LSTMCell, StaticLatent, resolve_scan
from lm_zoo.cells.pallas_alstm import pallas_alstm_recurrence
from lm_zoo.kernels.alstm_step import backward_step, forward_step
from lm_zoo.kernels.lstm_step import GATES, Tiles, row_tiles, tiles_for
from lm_zoo.models import RecurrentLayer

M, N, K, B, T = 3, 5, 4, 3, 3
LATENTS = {'recurrent': LSTMCell, 'static': StaticLatent}


def _window(cell, seed=1):
  return alstm_window_inputs(cell, B, M, N, T, seed)


def _loss(out):
  """A scalar that reads every output and every part of the final carry."""
  carry, hs = out
  weights = jnp.arange(1, hs.size + 1).reshape(hs.shape) / hs.size
  return jnp.sum(jnp.sin(hs) * weights) + sum(
    jnp.sum(jnp.cos(leaf) * (k + 1)) for k, leaf in enumerate(jax.tree.leaves(carry))
  )


def _values_and_gradients(cell, scan, args):
  def loss(params, carry, xs, mask):
    return _loss(
      RecurrentLayer(cell, scan=scan).apply({'params': {'cell': params}}, carry, xs, mask)
    )

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(*args)


def _args(cell, seed=1):
  carry, xs, mask = _window(cell, seed)
  params = perturb(
    RecurrentLayer(cell, scan='scan').init(jax.random.key(0), carry, xs, mask)['params']
  )['cell']
  return params, carry, xs, mask


def _relative(got, want):
  return float(jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30))


def _assert_gradients_within(got, want, tolerance):
  paths = jax.tree_util.tree_flatten_with_path(want)[0]
  for (path, w), g in zip(paths, jax.tree.leaves(got)):
    assert _relative(g, w) < tolerance, jax.tree_util.keystr(path)


# Interpreted, each window compiles its kernels into XLA (tens of seconds on a
# CPU): one case runs in CI, the others with -m slow (and, compiled, on a GPU in
# the run kit's kernels part).
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
  'latent, cap',
  [
    (LSTMCell, True),
    pytest.param(LSTMCell, False, marks=SLOW),
    pytest.param(StaticLatent, True, marks=SLOW),
    pytest.param(StaticLatent, False, marks=SLOW),
  ],
  ids=['recurrent capped', 'recurrent', 'static capped', 'static'],
)
def test_values_and_every_gradient_are_the_scans(latent, cap):
  cell = ALSTMCell(N, latent=latent, latent_size=K, cap_input_gate=cap)
  assert resolve_scan(cell, 'pallas') == 'pallas'
  args = _args(cell)
  want, want_grads = _values_and_gradients(cell, 'scan', args)
  got, got_grads = _values_and_gradients(cell, 'pallas', args)
  assert abs(got - want) <= 1e-5 * abs(want)
  _assert_gradients_within(got_grads, want_grads, 1e-5)


@SLOW
def test_outputs_and_carry_are_the_scans_with_the_state_mask_and_several_row_tiles():
  """17 rows: two programs of 16 rows, the second mostly padding."""
  cell = ALSTMCell(N, latent_size=K, cap_input_gate=True)
  rng = np.random.default_rng(2)
  carry = jax.tree.map(
    lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
    cell.initialize_carry(jax.random.key(0), (17, M)),
  )
  xs = jnp.asarray(rng.normal(size=(T, 17, M)), jnp.float32)
  mask = jnp.asarray(rng.binomial(1, 0.5, (17, N)) / 0.5, jnp.float32)
  params = perturb(cell.init(jax.random.key(0), carry, xs[0])['params'])
  want = RecurrentLayer(cell, scan='scan').apply({'params': {'cell': params}}, carry, xs, mask)
  got = pallas_alstm_recurrence(
    xs, params, carry, mask, cap_input_gate=True, tiles=Tiles(batch=16, chunk=16)
  )
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)
  unmasked = RecurrentLayer(cell, scan='scan').apply({'params': {'cell': params}}, carry, xs)
  assert not np.allclose(unmasked[1], want[1])  # the mask changes what is compared


@SLOW
@pytest.mark.parametrize('latent', LATENTS.values(), ids=LATENTS.keys())
def test_bfloat16_products_agree_with_the_scan_within_their_rounding(latent):
  cell = ALSTMCell(N, latent=latent, latent_size=K, dtype=jnp.bfloat16)
  args = _args(cell, seed=3)
  want, want_grads = _values_and_gradients(cell, 'scan', args)
  got, got_grads = _values_and_gradients(cell, 'pallas', args)
  assert abs(got - want) <= 1e-2 * abs(want)
  _assert_gradients_within(got_grads, want_grads, 3e-2)


def test_latent_dropout_and_other_latents_are_refused_and_auto_never_picks_pallas():
  dropping = ALSTMCell(N, latent_size=K, dropout_latent=0.2)
  with pytest.raises(ValueError, match="scan='pallas' cannot run ALSTMCell.*dropout_latent"):
    resolve_scan(dropping, 'pallas')
  other = ALSTMCell(N, latent_size=K, latent=lambda **kw: LSTMCell(cap_input_gate=True, **kw))
  with pytest.raises(
    ValueError,
    match=r"scan='pallas' cannot run ALSTMCell.*choose one of "
    r"'auto', 'scan', 'remat'",
  ):
    resolve_scan(other, 'pallas')
  assert resolve_scan(ALSTMCell(N, latent_size=K), 'auto') == 'fused'


def test_inputs_that_do_not_fit_the_input_kernel_are_refused():
  cell = ALSTMCell(N, latent_size=K)
  params, carry, xs, mask = _args(cell)
  with pytest.raises(ValueError, match=r'inputs \(3, 3, 2\) do not fit the aLSTM input kernel'):
    pallas_alstm_recurrence(xs[..., :2], params, carry, mask)


@pytest.mark.parametrize('latent', LATENTS.values(), ids=LATENTS.keys())
def test_a_carry_that_does_not_fit_the_inputs_is_refused(latent):
  """The kernels pad the states to their tiles: a carry of 4 rows for
  inputs of 3 ran and returned 4 rows of outputs, silently."""
  cell = ALSTMCell(N, latent=latent, latent_size=K)
  params, _, xs, mask = _args(cell)
  wider = cell.initialize_carry(jax.random.key(0), (B + 1, M))
  with pytest.raises(ValueError, match=r"the carry's arrays \(.*\(4, 5\), \(4, 5\)\) do not fit"):
    pallas_alstm_recurrence(xs, params, wider)


def test_each_program_owns_16_rows():
  """The recipe's batch of 20, padded to 32, runs as 2 programs a step,
  forward and back (`row_tiles`), not one."""
  cell = ALSTMCell(N, latent_size=K)
  carry, xs, mask = alstm_window_inputs(cell, 20, M, N, 2)
  params = jax.eval_shape(cell.init, jax.random.key(0), carry, xs[0])['params']
  loss = lambda p: _loss(pallas_alstm_recurrence(xs, p, carry, mask))
  grids = pallas_grids(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  assert grids == {'alstm_step_forward': (2,), 'alstm_step_backward': (2,)}


@pytest.mark.parametrize('recurrent', [True, False], ids=['recurrent', 'static'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16], ids=['float32', 'bfloat16'])
def test_both_kernels_lower_for_nvidia_gpus(recurrent, dtype):
  """Pallas lowers the kernels to Triton for CUDA without a GPU, at the 17M
  recipe's padded sizes (batch 20, 1150 units and 400 inputs, latent 100),
  in programs of the rows its window gives them."""
  batch, m, n, k = 20, 400, 1150, 100
  padding = tiles_for(batch, n)
  tiles = row_tiles(padding)
  pad = lambda size, multiple: -(-size // multiple) * multiple
  rows, m, n, k = pad(batch, padding.batch), *(pad(w, tiles.chunk) for w in (m, n, k))
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  low = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
  latent_gates = GATES if recurrent else 1
  latent_carry = (f32(rows, k), f32(rows, k)) if recurrent else ()
  latent_u = (low(k, GATES * k),) if recurrent else ()
  forward = jax.jit(
    lambda x, h, mask, c, latent_in, latent, weights: forward_step(
      x,
      h,
      mask,
      c,
      latent_in,
      latent,
      weights,
      cap_input_gate=True,
      tiles=tiles,
      dtype=dtype,
      interpret=False,
    )
  )
  backward = jax.jit(lambda *a: backward_step(*a, tiles=tiles, dtype=dtype, interpret=False))
  state = f32(rows, n)
  gates = f32(rows, GATES * n)
  policy = f32(rows, m + 13 * n)
  latent = (
    (f32(rows, k), f32(rows, k), f32(rows, k), f32(rows, GATES * k), f32(rows, k))
    if recurrent
    else (f32(rows, k),)
  )
  lowered = [
    lower_for_cuda(
      forward,
      f32(rows, m),
      state,
      state,
      state,
      f32(rows, latent_gates * k),
      latent_carry,
      (
        low(n, latent_gates * k),
        *latent_u,
        low(k, m + 13 * n),
        low(m, GATES * n),
        low(n, GATES * n),
        f32(GATES * n),
      ),
    ),
    lower_for_cuda(
      backward,
      state,
      state,
      state,
      state,
      (state, gates, state),
      f32(rows, m),
      state,
      (policy, gates, gates),
      latent,
      (
        low(m, GATES * n),
        low(n, GATES * n),
        f32(GATES * n),
        low(k, m + 13 * n),
        low(n, latent_gates * k),
        *latent_u,
      ),
    ),
  ]
  for lowered_step in lowered:
    assert '__gpu$xla.gpu.triton' in lowered_step.as_text()


def test_an_interpret_that_is_not_a_bool_or_none_is_refused():
  """Pallas takes any truthy value as True: interpret='no' ran interpreted."""
  params, carry, xs, mask = _args(ALSTMCell(N, latent_size=K))
  with pytest.raises(ValueError, match=r"interpret must be True .* or None .*, got 'no'"):
    pallas_alstm_recurrence(xs, params, carry, mask, interpret='no')


def test_a_state_mask_that_does_not_broadcast_to_h_is_refused():
  params, carry, xs, _ = _args(ALSTMCell(N, latent_size=K))
  with pytest.raises(ValueError, match=r"state_mask: its shape \(3, 4\) .* carry's h \(3, 5\)"):
    pallas_alstm_recurrence(xs, params, carry, jnp.ones((B, 4)))


def test_tiles_that_are_not_a_tiles_are_refused():
  params, carry, xs, mask = _args(ALSTMCell(N, latent_size=K))
  with pytest.raises(ValueError, match=r'tiles must be a .*Tiles, .* got \(16, 16, 16\)'):
    pallas_alstm_recurrence(xs, params, carry, mask, tiles=(16, 16, 16))
