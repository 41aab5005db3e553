"""The persistent Mosaic GPU LSTM kernel, without a GPU: run in Pallas' GPU
interpreter (TMA copies, wgmma, shared memory simulated) against the
`lax.scan` reference with bfloat16 products, as one block over a whole
window and as two blocks a step per launch (the interpreter has no
semaphores); the multi-block persistent form, semaphore and all, lowered
for CUDA through `jax.export`. On a GPU, benchmarks/persistent_probe.py
checks and times it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from persistent_lowering import check_lowered_modes

from lm_zoo.cells.lstm_recurrence import lstm_recurrence
from lm_zoo.cells.persistent_lstm import persistent_lstm_recurrence
from lm_zoo.kernels.persistent_lstm import Layout, layout_for, persistent_lstm_forward, smem_bytes

INTERPRET = plgpu.InterpretGPUParams()

T, B, N = 4, 3, 24  # padded to 64 rows and 32 units


def _inputs(seed, steps=T, batch=B, n=N):
  rng = np.random.default_rng(seed)
  as32 = lambda a: jnp.asarray(a, jnp.float32)
  return (
    as32(rng.normal(size=(steps, batch, 4 * n))),
    as32(0.3 * rng.normal(size=(n, 4 * n))),
    as32(np.tanh(rng.normal(size=(batch, n)))),
    as32(rng.normal(size=(batch, n))),
  )


def _reference(projected, kernel, h0, c0, cap, mask=None):
  return lstm_recurrence(projected, kernel, (c0, h0), mask, dtype=jnp.bfloat16, cap_input_gate=cap)


def _assert_close(got, want, tol=2e-5):
  for got_part, want_part in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(got_part, want_part, rtol=tol, atol=tol)


@pytest.mark.parametrize('cap', [False, True])
def test_one_block_runs_the_whole_window_as_the_reference(cap):
  args = _inputs(0)
  got = persistent_lstm_forward(*args, cap_input_gate=cap, blocks=1, interpret=INTERPRET)
  _assert_close(got, _reference(*args, cap))


def _state_mask(seed, batch=B, n=N):
  """Variational dropout's mask: zeros and 1 / 0.6 (not a bfloat16)."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.binomial(1, 0.6, (batch, n)) / 0.6, jnp.float32)


@pytest.mark.parametrize('cap', [False, True])
def test_two_blocks_a_step_per_launch_are_the_reference(cap):
  """Each block's slices of U, P, c, h and (capped) the state mask (16 of 32
  padded units)."""
  args = _inputs(1, steps=3)
  mask = _state_mask(1) if cap else None
  got = persistent_lstm_forward(
    *args, state_mask=mask, cap_input_gate=cap, blocks=2, mode='per_step', interpret=INTERPRET
  )
  _assert_close(got, _reference(*args, cap, mask))


def test_one_block_masks_the_fed_back_state_and_not_the_outputs():
  """m ⊙ h_{t-1} feeds the product, h_t is output as it is: far from the
  unmasked window."""
  args = _inputs(5)
  mask = _state_mask(5)
  got = persistent_lstm_forward(*args, state_mask=mask, blocks=1, interpret=INTERPRET)
  _assert_close(got, _reference(*args, False, mask))
  with pytest.raises(AssertionError):
    _assert_close(got, _reference(*args, False), tol=1e-2)


def test_the_default_grid_of_four_blocks_pads_odd_sizes():
  """n = 20 and batch 5: 32 units in 4 blocks of 8, 64 rows."""
  args = _inputs(2, steps=2, batch=5, n=20)
  got = persistent_lstm_forward(*args, mode='per_step', interpret=INTERPRET)
  assert got[1].shape == (2, 5, 20)
  _assert_close(got, _reference(*args, False))


def test_the_comparison_catches_a_wrong_gate_order():
  """The same inputs with the i and j gates' columns swapped (P and U
  alike) give outputs far outside the tolerance."""
  projected, kernel, h0, c0 = _inputs(3)
  swap = lambda a: jnp.concatenate(
    [a[..., 2 * N : 3 * N], a[..., N : 2 * N], a[..., :N], a[..., 3 * N :]], -1
  )
  got = persistent_lstm_forward(
    swap(projected), swap(kernel), h0, c0, blocks=1, interpret=INTERPRET
  )
  with pytest.raises(AssertionError):
    _assert_close(got, _reference(projected, kernel, h0, c0, False), tol=1e-2)


def test_the_recipe_layout_fits_an_sm():
  """Hidden 951, batch 64: 120 blocks of 8 units (an H100 has 132 SMs) and
  U's slice 60 KiB, h 120 KiB, P's slice, c, m and the outgoing tiles 15
  KiB (each buffer rounded up to 1 KiB), the barriers 40 bytes; 8 KiB more
  with the residuals' tile (227 KiB allowed)."""
  layout = layout_for(64, 951)
  assert layout == Layout(rows=64, units=960, blocks=120) and layout.block_units == 8
  assert smem_bytes(layout) == 2 * 960 * 32 + 2 * 64 * 960 + 1024 * (8 + 2 + 2 + 2 + 1) + 40
  assert smem_bytes(layout, saves=True) == smem_bytes(layout) + 4 * 64 * 32 == 207_912
  assert layout_for(3, 24, blocks=2) == Layout(rows=64, units=32, blocks=2)


@pytest.mark.parametrize('residuals', [False, True])
def test_the_layout_counts_shared_memory_as_mosaic_gpu_does(monkeypatch, residuals):
  """Mosaic GPU refuses a kernel over its bound, naming what it allocates:
  `smem_bytes` is that count, with and without the residuals' tile."""
  from jax.experimental.mosaic.gpu import core

  monkeypatch.setattr(core, '_SMEM_SIZE_BOUND', 1000)
  needed = smem_bytes(layout_for(3, 24), saves=residuals)
  with pytest.raises(ValueError, match=f'smem_bytes={needed} > max_smem_bytes=1000'):
    _lowered(2, 3, 24, 'persistent', residuals=residuals)


@pytest.mark.parametrize(
  'change, message',
  [
    (dict(batch=65), 'batch must be at most 64'),
    (dict(blocks=4, n=951), 'blocks=4 gives each block 256 of 951 units; at most 64'),
    (
      dict(mode='fast'),
      "mode must be one of persistent, unfenced, per_step, no_barrier, got 'fast'",
    ),
    (dict(kernel_n=23), r'recurrent_kernel must be \(n, 4n\)'),
    (dict(mask_n=23), r'state_mask must be \(B, n\) = \(3, 24\)'),
    (dict(blocks=2), "mode='persistent' with blocks=2 cannot run interpreted"),
  ],
)
def test_refuses_what_it_cannot_run_naming_the_argument(change, message):
  batch, n = change.get('batch', B), change.get('n', N)
  projected, kernel, h0, c0 = _inputs(4, steps=1, batch=batch, n=n)
  if 'kernel_n' in change:
    kernel = kernel[: change['kernel_n']]
  run = functools.partial(
    persistent_lstm_forward,
    state_mask=jnp.ones((batch, change['mask_n'])) if 'mask_n' in change else None,
    blocks=change.get('blocks'),
    mode=change.get('mode', 'persistent'),
  )
  with pytest.raises(ValueError, match=message):
    run(projected, kernel, h0, c0, interpret=INTERPRET)


@pytest.mark.parametrize(
  'settings, message',
  [
    (
      dict(interpret=True),
      r'interpret must be None \(compiled for a GPU\) or plgpu.InterpretGPUParams',
    ),
    (dict(interpret='yes'), r"got 'yes': pass \*\*where_it_runs\(\) for this backend"),
    (dict(blocks=2.5), 'blocks must be a whole number >= 1, or None .* got 2.5'),
    (dict(blocks=True), 'blocks must be a whole number >= 1, or None .* got True'),
    (
      dict(mode='fast'),
      "mode must be one of persistent, unfenced, per_step, no_barrier, got 'fast'",
    ),
  ],
  ids=['interpret True', "interpret 'yes'", 'blocks 2.5', 'blocks True', 'mode'],
)
def test_the_window_refuses_settings_it_cannot_run_naming_them(settings, message):
  """Before tracing: interpret=True (the Triton kernels' flag) failed deep in
  Pallas' discharge rules, blocks=2.5 in JAX's shape code, and blocks=True
  ran as one block."""
  projected, kernel, h0, c0 = _inputs(4, steps=1)
  run = functools.partial(persistent_lstm_recurrence, **{'interpret': INTERPRET, **settings})
  with pytest.raises(ValueError, match=message):
    run(projected, kernel, (c0, h0))


def test_the_window_refuses_a_state_mask_that_does_not_broadcast_to_h():
  projected, kernel, h0, c0 = _inputs(4, steps=1)
  with pytest.raises(ValueError, match=r"state_mask: its shape \(3, 23\) .* carry's h \(3, 24\)"):
    persistent_lstm_recurrence(projected, kernel, (c0, h0), jnp.ones((B, 23)), interpret=INTERPRET)


def _lowered(steps, batch, n, mode, residuals=False):
  s = jax.ShapeDtypeStruct
  shapes = [s((steps, batch, 4 * n), jnp.float32), s((n, 4 * n), jnp.float32)]
  shapes += [s((batch, n), jnp.float32)] * 2
  forward = functools.partial(persistent_lstm_forward, residuals=residuals)
  run = jax.jit(functools.partial(forward, mode=mode, cap_input_gate=True))
  return jax.export.export(run, platforms=['cuda'])(*shapes).mlir_module()


@pytest.mark.parametrize('steps, batch, n', [(70, 64, 951), (2, 3, 24)])
def test_the_persistent_grid_lowers_for_cuda_with_its_semaphore(steps, batch, n):
  """Mosaic GPU lowers the kernel without a GPU (its layout inference and
  the wgmma's operand checks run here), each mode with the barrier it has
  (`check_lowered_modes`)."""
  check_lowered_modes(lambda mode: _lowered(steps, batch, n, mode))


def test_the_kernel_refuses_an_interpret_that_is_not_the_interpreters():
  """Only None lays the operands out for the GPU: interpret=False compiled
  the interpreter's layouts."""
  projected, kernel, h0, c0 = _inputs(4, steps=1)
  with pytest.raises(ValueError, match=r'interpret must be None .* got False\b'):
    persistent_lstm_forward(projected, kernel, h0, c0, blocks=1, interpret=False)
