"""The Pallas LSTM step kernels (interpreted on the CPU) against the step's
equations in NumPy and its autodiff gradient, and lowered for NVIDIA GPUs
(Pallas' Triton lowering runs here without one) at the papers' sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import lower_for_cuda

from lm_zoo.cells.lstm_recurrence import gate_factors
from lm_zoo.kernels.lstm_step import Tiles, backward_step, forward_step, tiles_for

TILES = Tiles(batch=16, units=16, chunk=16)
B, N = 16, 48  # three unit tiles, three chunks of the summed axis


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _step_inputs(seed):
  rng = np.random.default_rng(seed)
  h = np.tanh(rng.normal(size=(B, N)))
  mask = rng.binomial(1, 0.7, (B, N)) / 0.7
  c = rng.normal(size=(B, N))
  projected = rng.normal(size=(4, B, N))
  kernel = 0.3 * rng.normal(size=(4, N, N))
  return h, mask, c, projected, kernel


def _numpy_step(h, mask, c, projected, kernel, cap):
  gates = projected + np.einsum('bk,gkj->gbj', h * mask, kernel)
  i, f, j, o = _sigmoid(gates[0]), _sigmoid(gates[1]), np.tanh(gates[2]), _sigmoid(gates[3])
  new_c = f * c + (np.minimum(1 - f, i) if cap else i) * j
  return new_c, o * np.tanh(new_c), np.stack([i, f, j, o])


def _as32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


@pytest.mark.parametrize('cap', [False, True])
def test_forward_step_is_the_lstm_step_in_numpy(cap):
  args = _step_inputs(0)
  got = forward_step(*_as32(*args), tiles=TILES, dtype=jnp.float32, cap_input_gate=cap)
  for got_part, want in zip(got, _numpy_step(*args, cap)):
    np.testing.assert_allclose(got_part, want, rtol=1e-5, atol=1e-5)


def test_forward_step_in_bfloat16_rounds_only_the_product_operands():
  args = _step_inputs(1)
  h, mask, c, projected, kernel = args
  rounded = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)
  want = _numpy_step(rounded(h * mask), np.ones_like(mask), c, projected, rounded(kernel), False)
  got = forward_step(*_as32(*args), tiles=TILES, dtype=jnp.bfloat16, cap_input_gate=False)
  for got_part, want_part in zip(got, want):
    np.testing.assert_allclose(got_part, want_part, rtol=1e-5, atol=1e-5)


def _autodiff_step_gradients(args, cap, d_h, d_c):
  """dL/dP, dL/d(m ⊙ h_{t-1}) and dL/dc_{t-1} of one step, by JAX's autodiff
  of the equations, for the cotangents d_h and d_c of (h_t, c_t)."""
  _, _, c, projected, kernel = _as32(*args)

  def step(masked_h, c, projected):
    gates = projected + jnp.einsum('bk,gkj->gbj', masked_h, kernel, precision='highest')
    i, f = jax.nn.sigmoid(gates[0]), jax.nn.sigmoid(gates[1])
    new_c = f * c + (jnp.minimum(1 - f, i) if cap else i) * jnp.tanh(gates[2])
    return jax.nn.sigmoid(gates[3]) * jnp.tanh(new_c), new_c

  h, mask = _as32(args[0], args[1])
  _, vjp = jax.vjp(step, h * mask, c, projected)
  d_masked_h, d_c_prev, d_projected = vjp((d_h, d_c))
  return d_projected, d_masked_h, d_c_prev


@pytest.mark.parametrize('cap', [False, True])
def test_backward_step_is_the_autodiff_gradient_of_the_step(cap):
  args = _step_inputs(2)
  rng = np.random.default_rng(3)
  d_out, d_rec, d_c = _as32(*(rng.normal(size=(B, N)) for _ in range(3)))
  h, mask, c, _, _ = _as32(*args)
  _, _, acts = forward_step(*_as32(*args), tiles=TILES, dtype=jnp.float32, cap_input_gate=cap)
  new_c = _numpy_step(*args, cap)[0]
  forget, d_c_from_h, scales = gate_factors(
    *acts[:, None], jnp.asarray(new_c, jnp.float32)[None], c, cap
  )
  # The step after this one sends d_rec through its mask: dL/dh_t = d_out + d_rec ⊙ m.
  got = backward_step(
    d_out,
    d_rec,
    mask,
    d_c,
    d_c_from_h[0],
    jnp.stack(scales)[:, 0],
    forget[0],
    _as32(args[4])[0],
    tiles=TILES,
    dtype=jnp.float32,
  )
  d_c_prev, d_masked_h, d_gates = got
  want_gates, want_masked_h, want_c_prev = _autodiff_step_gradients(
    args, cap, d_out + d_rec * mask, d_c
  )
  np.testing.assert_allclose(d_gates, want_gates, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_masked_h, want_masked_h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_c_prev, want_c_prev, rtol=1e-5, atol=1e-5)


def test_tiles_are_powers_of_two_and_shapes_must_tile():
  with pytest.raises(ValueError, match='Tiles.units must be a power of two, got 24'):
    Tiles(units=24)
  with pytest.raises(ValueError, match='Tiles.batch must be at least 16'):
    Tiles(batch=8)
  h, mask, c, projected, kernel = _as32(*_step_inputs(0))
  with pytest.raises(
    ValueError,
    match=r'a step of \(16, 40, 40\) does not tile .* widths to one '
    'of 16',
  ):
    forward_step(
      h[:, :40],
      mask[:, :40],
      c[:, :40],
      projected[..., :40],
      kernel[:, :40, :40],
      tiles=TILES,
      dtype=jnp.float32,
      cap_input_gate=False,
    )


@pytest.mark.parametrize('batch, units', [(64, 960), (20, 1152), (4, 16)])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16], ids=['float32', 'bfloat16'])
def test_both_kernels_lower_for_nvidia_gpus(batch, units, dtype):
  """Pallas lowers the kernels to Triton for CUDA without a GPU: at the 24M
  recipes' padded sizes (batch 64, 912 and 951 units padded to 960; the
  aLSTM's batch 20 and 1150 units) and a tiny one."""
  tiles = tiles_for(batch, units)
  rows = -(-batch // tiles.batch) * tiles.batch
  state = jax.ShapeDtypeStruct((rows, units), jnp.float32)
  gates = jax.ShapeDtypeStruct((4, rows, units), jnp.float32)
  kernel = jax.ShapeDtypeStruct((4, units, units), dtype)
  forward = jax.jit(
    lambda *a: forward_step(*a, tiles=tiles, dtype=dtype, cap_input_gate=True, interpret=False)
  )
  backward = jax.jit(lambda *a: backward_step(*a, tiles=tiles, dtype=dtype, interpret=False))
  lowered = [
    lower_for_cuda(forward, state, state, state, gates, kernel),
    lower_for_cuda(backward, *(state,) * 5, gates, state, kernel),
  ]
  for low in lowered:
    assert '__gpu$xla.gpu.triton' in low.as_text()


@pytest.mark.parametrize('interpret', ['no', 1], ids=repr)
def test_an_interpret_that_is_not_a_bool_or_none_is_refused(interpret):
  """Pallas takes any truthy value as True: interpret='no' ran interpreted."""
  h, mask, c, projected, kernel = _as32(*_step_inputs(0))
  refused = r"interpret must be True \(Pallas' interpreter\), False .* or None .*, got "
  with pytest.raises(ValueError, match=refused + repr(interpret)):
    forward_step(
      h,
      mask,
      c,
      projected,
      kernel,
      tiles=TILES,
      dtype=jnp.float32,
      cap_input_gate=False,
      interpret=interpret,
    )
  with pytest.raises(ValueError, match=refused + repr(interpret)):
    backward_step(
      c, c, mask, c, c, projected, c, kernel, tiles=TILES, dtype=jnp.float32, interpret=interpret
    )
