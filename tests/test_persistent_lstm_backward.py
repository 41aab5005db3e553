"""The persistent LSTM's backward kernel and the differentiable window built
on both kernels, without a GPU: run in Pallas' GPU interpreter (TMA copies,
wgmma, shared memory simulated; one block over a whole window, or several
blocks a step per launch: the interpreter has no semaphores) against
`lstm_recurrence` with bfloat16 products, its reverse scan and its
gradients; the multi-block persistent forms lowered for CUDA through
`jax.export`. On a GPU, benchmarks/persistent_probe.py checks and times them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from persistent_lowering import check_lowered_modes

from lm_zoo.cells.lstm_recurrence import (
  backward_factors,
  gate_activations,
  gates_gradient,
  lstm_recurrence,
)
from lm_zoo.cells.persistent_lstm import persistent_lstm_recurrence
from lm_zoo.kernels.persistent_lstm import layout_for
from lm_zoo.kernels.persistent_lstm_backward import (
  backward_smem_bytes,
  chunk_for,
  persistent_lstm_backward,
)

INTERPRET = plgpu.InterpretGPUParams()

T, B, N = 3, 3, 24  # padded to 64 rows and 32 units: 4n_pad = 128 summed columns


def _normal(rng, shape, scale=1.0):
  return jnp.asarray(scale * rng.normal(size=shape), jnp.float32)


def _chain_inputs(seed, steps=T, batch=B, n=N, cap=False):
  """(d_hs, gate_scales, σ(f), dc/dh, U, d_c_T, d_h_T) of random activations."""
  rng = np.random.default_rng(seed)
  acts = gate_activations(_normal(rng, (steps, batch, 4 * n)))
  cs, c0 = _normal(rng, (steps, batch, n)), _normal(rng, (batch, n))
  forget, d_c_from_h, scales = backward_factors(acts, cs, c0, cap)
  d_hs, kernel = _normal(rng, (steps, batch, n)), _normal(rng, (n, 4 * n), 0.3)
  return (
    d_hs,
    scales,
    forget,
    d_c_from_h,
    kernel,
    _normal(rng, (batch, n)),
    _normal(rng, (batch, n)),
  )


def _reference_chain(d_hs, scales, forget, d_c_from_h, kernel, d_c_last, d_h_last, mask=1.0):
  """`lstm_recurrence`'s reverse scan: (dG, d_c_0, d_h_0), the state masked by `mask`."""

  def step(carry, xs):
    d_c, d_h_next = carry
    d_h_out, forget_t, d_c_from_h_t, scales_t = xs
    d_c, d_gates = gates_gradient(d_c, d_h_out + d_h_next, d_c_from_h_t, scales_t)
    d_h_in = jnp.dot(
      d_gates.astype(jnp.bfloat16),
      kernel.T.astype(jnp.bfloat16),
      preferred_element_type=jnp.float32,
    )
    return (d_c * forget_t, d_h_in * mask), d_gates

  xs = (d_hs, forget, d_c_from_h, scales)
  (d_c0, d_h0), d_gates = jax.lax.scan(step, (d_c_last, d_h_last), xs, reverse=True)
  return d_gates, d_c0, d_h0


def _assert_close(got, want, tol=2e-5):
  for got_part, want_part in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(got_part, want_part, rtol=tol, atol=tol)


def _state_mask(seed, batch=B, n=N):
  """Variational dropout's mask: zeros and 1 / 0.6 (not a bfloat16)."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.binomial(1, 0.6, (batch, n)) / 0.6, jnp.float32)


@pytest.mark.parametrize(
  'blocks, chunk, mode, masked',
  [(1, 32, 'persistent', True), (1, None, 'no_barrier', False), (2, 64, 'per_step', True)],
)
def test_the_backward_chain_is_the_reference_reverse_scan(blocks, chunk, mode, masked):
  """Chunks of 32 columns: 4 a step through 2 buffers, each refilled; 64:
  2 chunks; None: the whole 128 at once. One block needs no barrier."""
  args = _chain_inputs(0, cap=blocks == 2)
  mask = _state_mask(0) if masked else None
  got = persistent_lstm_backward(
    *args, state_mask=mask, blocks=blocks, chunk=chunk, mode=mode, interpret=INTERPRET
  )
  _assert_close(got, _reference_chain(*args, 1.0 if mask is None else mask))


def test_the_chains_comparison_catches_a_wrong_transpose():
  """U with its gate columns rotated gives dG far outside the tolerance."""
  d_hs, scales, forget, d_c_from_h, kernel, d_c, d_h = _chain_inputs(1)
  wrong = jnp.roll(kernel, N, axis=1)
  got = persistent_lstm_backward(
    d_hs, scales, forget, d_c_from_h, wrong, d_c, d_h, blocks=1, interpret=INTERPRET
  )
  with pytest.raises(AssertionError):
    _assert_close(got, _reference_chain(d_hs, scales, forget, d_c_from_h, kernel, d_c, d_h), 1e-2)


def _window_inputs(seed, steps=T, batch=B, n=N):
  rng = np.random.default_rng(seed)
  projected, kernel = _normal(rng, (steps, batch, 4 * n)), _normal(rng, (n, 4 * n), 0.3)
  c0, h0 = _normal(rng, (batch, n)), jnp.tanh(_normal(rng, (batch, n)))
  return projected, kernel, c0, h0, _normal(rng, (steps, batch, n))


def _gradients(window, projected, kernel, c0, h0, weights, mask=None):
  """The values and the gradients (P, U, c_0, h_0 and a mask's) of a loss of
  hs, c_T and h_T."""

  def loss(projected, kernel, c0, h0, mask):
    (c, h), hs = window(projected, kernel, (c0, h0), mask)
    return jnp.sum(hs * weights) + jnp.sum(0.7 * c) - jnp.sum(0.3 * h), hs

  wrt = (0, 1, 2, 3) if mask is None else (0, 1, 2, 3, 4)
  (value, hs), grads = jax.value_and_grad(loss, wrt, has_aux=True)(projected, kernel, c0, h0, mask)
  return value, hs, grads


@pytest.mark.parametrize(
  'seed, sizes, blocks, mode, cap, masked',
  [
    (2, (T, B, N), 1, 'persistent', False, False),
    (3, (T, B, N), 1, 'persistent', True, True),
    (4, (2, 5, 20), None, 'per_step', True, True),  # 4 blocks of 8 units, odd sizes
  ],
)
def test_the_windows_gradients_are_lstm_recurrences(seed, sizes, blocks, mode, cap, masked):
  """With a state mask, its gradient too (taken in XLA after the kernels)."""
  *args, weights = _window_inputs(seed, *sizes)
  mask = _state_mask(seed, *sizes[1:]) if masked else None
  window = functools.partial(
    persistent_lstm_recurrence, cap_input_gate=cap, blocks=blocks, mode=mode, interpret=INTERPRET
  )
  reference = functools.partial(lstm_recurrence, dtype=jnp.bfloat16, cap_input_gate=cap)
  _assert_close(
    _gradients(window, *args, weights, mask), _gradients(reference, *args, weights, mask)
  )


def test_the_gradients_comparison_catches_an_ignored_mask():
  """The masked window's values and gradients are far from the unmasked
  reference's, and a mask of ones gives the unmasked window's."""
  *args, weights = _window_inputs(8)
  window = functools.partial(persistent_lstm_recurrence, blocks=1, interpret=INTERPRET)
  reference = functools.partial(lstm_recurrence, dtype=jnp.bfloat16)
  masked = _gradients(window, *args, weights, _state_mask(8))
  with pytest.raises(AssertionError):
    _assert_close(masked[:2], _gradients(reference, *args, weights)[:2], 1e-2)
  ones = _gradients(window, *args, weights, jnp.ones((B, N)))
  _assert_close(ones[:2] + ones[2][:4], _gradients(reference, *args, weights))


def test_the_gradients_comparison_catches_a_wrong_cap():
  """The uncapped window's gradients are far from the capped reference's."""
  *args, weights = _window_inputs(5)
  window = functools.partial(persistent_lstm_recurrence, blocks=1, interpret=INTERPRET)
  reference = functools.partial(lstm_recurrence, dtype=jnp.bfloat16, cap_input_gate=True)
  with pytest.raises(AssertionError):
    _assert_close(_gradients(window, *args, weights)[2], _gradients(reference, *args, weights)[2])


def test_the_recipe_layout_fits_an_sm_backward():
  """Hidden 951, batch 64: chunks of 480 of the 3840 summed columns, and
  U's rows 60 KiB + two buffers 120 KiB + factors, d_c, m and dG_t 30 KiB
  (each buffer rounded up to 1 KiB) + the barriers 48 bytes = 210 KiB of
  shared memory a block (227 KiB allowed)."""
  layout = layout_for(64, 951)
  assert chunk_for(layout) == 480 and chunk_for(layout_for(3, 24)) == 128
  assert backward_smem_bytes(layout, 480) == 2 * 8 * 3840 + 2 * 2 * 64 * 480 + 64 * 8 * 60 + 48
  assert backward_smem_bytes(layout, 480) == 215_088


def test_the_backward_counts_shared_memory_as_mosaic_gpu_does(monkeypatch):
  """Mosaic GPU refuses a kernel over its bound, naming what it allocates:
  `backward_smem_bytes` is that count."""
  from jax.experimental.mosaic.gpu import core

  monkeypatch.setattr(core, '_SMEM_SIZE_BOUND', 1000)
  layout = layout_for(3, 24)
  needed = backward_smem_bytes(layout, chunk_for(layout))
  with pytest.raises(ValueError, match=f'smem_bytes={needed} > max_smem_bytes=1000'):
    _lowered_backward(2, 3, 24, 'persistent')


@pytest.mark.parametrize(
  'change, message',
  [
    (
      dict(mode='fast'),
      "mode must be one of persistent, unfenced, per_step, no_barrier, got 'fast'",
    ),
    (dict(chunk=48), 'chunk must be a multiple of 32 dividing 128, got 48'),
    (dict(blocks=2), "mode='persistent' with blocks=2 cannot run interpreted"),
    (dict(wrong='forget'), r'forget must be \(3, 3, 24\)'),
    (dict(wrong='recurrent_kernel'), r'recurrent_kernel must be \(24, 96\)'),
    (dict(wrong='d_h_last'), r'd_h_last must be \(3, 24\)'),
    (dict(wrong='state_mask'), r'state_mask must be \(3, 24\)'),
  ],
)
def test_the_backward_refuses_what_it_cannot_run_naming_the_argument(change, message):
  args = dict(
    zip(
      ('d_hs', 'gate_scales', 'forget', 'd_c_from_h', 'recurrent_kernel', 'd_c_last', 'd_h_last'),
      _chain_inputs(6),
    )
  )
  if 'wrong' in change:
    args[change.pop('wrong')] = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match=message):
    persistent_lstm_backward(**args, **change, interpret=INTERPRET)


def test_the_window_refuses_a_persistent_grid_interpreted():
  *args, _ = _window_inputs(7)
  with pytest.raises(ValueError, match="mode='persistent' with blocks=2 cannot run interpreted"):
    persistent_lstm_recurrence(args[0], args[1], (args[2], args[3]), blocks=2, interpret=INTERPRET)


def _lowered_backward(steps, batch, n, mode):
  s, f32 = jax.ShapeDtypeStruct, jnp.float32
  shapes = [s((steps, batch, n), f32), s((steps, batch, 4 * n), f32)]
  shapes += [s((steps, batch, n), f32)] * 2 + [s((n, 4 * n), f32)] + [s((batch, n), f32)] * 2
  run = jax.jit(functools.partial(persistent_lstm_backward, mode=mode))
  return jax.export.export(run, platforms=['cuda'])(*shapes).mlir_module()


@pytest.mark.parametrize('steps, batch, n', [(70, 64, 951), (2, 3, 24)])
def test_the_persistent_backward_lowers_for_cuda_with_its_semaphore(steps, batch, n):
  """Mosaic GPU lowers it without a GPU (layout inference, the wgmma
  operand checks, the transposed U operand), each mode with the barrier it
  has (`check_lowered_modes`)."""
  check_lowered_modes(lambda mode: _lowered_backward(steps, batch, n, mode))


def test_the_windows_gradient_lowers_for_cuda_as_two_persistent_kernels():
  """jax.grad of a loss of the window at the recipe's size, its state
  masked: the forward (writing its residuals) and the backward kernel, each
  with its semaphore. `contract`'s CPU layout constraint is exported too:
  tracing on a CPU, it takes the CPU's path (on a GPU it is a plain einsum)."""
  s, f32, n = jax.ShapeDtypeStruct, jnp.float32, 951

  def loss(projected, kernel, c0, h0, mask):
    return jnp.sum(
      persistent_lstm_recurrence(projected, kernel, (c0, h0), mask, cap_input_gate=True)[1]
    )

  run = jax.jit(jax.grad(loss, (0, 1, 2, 3, 4)))
  shapes = [s((70, 64, 4 * n), f32), s((n, 4 * n), f32)] + [s((64, n), f32)] * 3
  layouts = [jax.export.DisabledSafetyCheck.custom_call('LayoutConstraint')]
  text = jax.export.export(run, platforms=['cuda'], disabled_checks=layouts)(*shapes).mlir_module()
  assert text.count('@mosaic_gpu') == 2 and text.count('red.release') == 2
