"""The persistent Mosaic GPU Mogrifier LSTM kernel, without a GPU: run in
Pallas' GPU interpreter (TMA copies, wgmma, shared memory simulated) against
`mixed_lstm_forward` with `MogrifierRounds` in bfloat16, as one block over a
whole window and as 2 and 4 blocks a phase per launch (the interpreter has no
semaphores); the persistent grid, semaphore and all, lowered for CUDA at the
24M recipe's size through `jax.export`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from persistent_lowering import check_lowered_modes

from lm_zoo.cells.mixed_lstm_recurrence import mixed_lstm_forward
from lm_zoo.cells.mogrifier import MogrifierRounds, round_name
from lm_zoo.cells.persistent_mogrifier import PersistentMogrifierKernels
from lm_zoo.kernels.persistent_lstm import grid_for
from lm_zoo.kernels.persistent_mogrifier import persistent_mogrifier_forward
from lm_zoo.kernels.persistent_mogrifier_phases import plan_for

INTERPRET = plgpu.InterpretGPUParams()


def _inputs(seed, steps, batch, m, n, rounds, rank):
  """(x, rounds' parameters, W, b, U, h0, c0); round 2 without a bias."""
  rng = np.random.default_rng(seed)
  f = lambda *shape, scale=1.0: jnp.asarray(scale * rng.normal(size=shape), jnp.float32)
  kept = []
  for i in range(1, rounds + 1):
    source, target = (n, m) if i % 2 else (m, n)
    p = {'kernel_in': f(source, rank, scale=0.5), 'kernel_out': f(rank, target, scale=0.5)}
    if i != 2:
      p['bias'] = f(target, scale=0.3)
    kept.append(p)
  weights = f(m, 4 * n, scale=0.3), f(4 * n, scale=0.3), f(n, 4 * n, scale=0.3)
  return (f(steps, batch, m), kept, *weights, jnp.tanh(f(batch, n)), f(batch, n))


def _state_mask(seed, batch, n):
  """Variational dropout's mask: zeros and 1 / 0.6 (not a bfloat16)."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.binomial(1, 0.6, (batch, n)) / 0.6, jnp.float32)


def _reference(args, mask, cap, zigzag):
  x, rounds, input_kernel, bias, recurrent_kernel, h0, c0 = args
  mix = MogrifierRounds(len(rounds), zigzag, jnp.bfloat16)
  mix_params = {round_name(i): p for i, p in enumerate(rounds, start=1)}
  return mixed_lstm_forward(
    x, input_kernel, bias, recurrent_kernel, (c0, h0), mix, mix_params, mask,
    dtype=jnp.bfloat16, cap_input_gate=cap,
  )  # fmt: skip


def _check(args, mask=None, cap=False, zigzag=True, **run):
  """Every output against the reference: float32 ones to 2e-5, [x^↑, h^↑]
  (bfloat16) within one bfloat16 ulp (or 2e-5 near zero)."""
  kernel = functools.partial(
    persistent_mogrifier_forward, cap_input_gate=cap, zigzag=zigzag, interpret=INTERPRET, **run
  )
  got = jax.jit(kernel)(*args, state_mask=mask)
  want = _reference(args, mask, cap, zigzag)
  (hs, (c, h), (acts, cs, mixed, residuals)), (*want_f32, want_mixed) = got, _float32_last(want)
  assert mixed.dtype == jnp.bfloat16 and residuals.shape == want_f32[-1].shape
  for got_part, want_part in zip((hs, c, h, acts, cs, residuals), want_f32):
    np.testing.assert_allclose(got_part, want_part, rtol=2e-5, atol=2e-5)
  # One bfloat16 ulp, or the float32 outputs' 2e-5 near zero (h^0 = m ⊙ h_{t-1} carries theirs).
  np.testing.assert_allclose(
    mixed.astype(np.float32), want_mixed.astype(np.float32), rtol=2**-7, atol=2e-5
  )


def _float32_last(outputs):
  """`mixed_lstm_forward`'s outputs as (hs, c, h, acts, cs, residuals, mixed)."""
  hs, (c, h), (acts, cs, mixed, residuals) = outputs
  return hs, c, h, acts, cs, residuals, mixed


@pytest.mark.parametrize('masked_and_capped', [False, True])
def test_one_block_runs_the_whole_window_as_the_reference(masked_and_capped):
  """T = 3, B = 3, m = 5, n = 8, r = 3, k = 4: padded to 64 rows, 32 units
  and inputs, k_pad 32 (4 pairs, 4 slots)."""
  args = _inputs(0, 3, 3, 5, 8, 3, 4)
  mask = _state_mask(0, 3, 8) if masked_and_capped else None
  _check(args, mask, cap=masked_and_capped, blocks=1)


def test_one_round_gates_with_the_fed_back_state():
  """r = 1: h^↑ is h^0 = m ⊙ h_{t-1} itself, the history's previous step."""
  args = _inputs(1, 2, 3, 5, 8, 1, 4)
  _check(args, _state_mask(1, 3, 8), blocks=1)


@pytest.mark.parametrize(
  'blocks, rounds, rank, zigzag, masked_and_capped',
  [(2, 2, 20, False, False), (4, 5, 20, True, True)],
)
def test_blocks_a_phase_per_launch_are_the_reference(
  blocks, rounds, rank, zigzag, masked_and_capped
):
  """m = 12, n = 24 (m_pad = n_pad = 32, k_pad = 32: 4 pairs a round, more
  pairs than blocks, so a block holds several; two of a round with 2 blocks)."""
  args = _inputs(2, 2, 5, 12, 24, rounds, rank)
  mask = _state_mask(2, 5, 24) if masked_and_capped else None
  plan = plan_for(grid_for(5, 24, blocks), 12, rank, rounds, zigzag=zigzag,
                  cap_input_gate=False, transposed=False)  # fmt: skip
  assert plan.slots > 1 and plan.layout.blocks == blocks
  _check(args, mask, cap=masked_and_capped, zigzag=zigzag, blocks=blocks, mode='per_step')


def test_the_recipe_plan_fits_an_sm():
  """m = n = 912, k = 84, r = 5, batch 64: 116 blocks of 8 units and 8
  inputs, k_pad 96 (60 pairs: one slot), chunks of 32 columns, 209,944
  bytes of shared memory a block (227 KiB allowed), buffer by buffer."""
  plan = plan_for(grid_for(64, 912), 912, 84, 5, zigzag=True, cap_input_gate=False,
                  transposed=True)  # fmt: skip
  assert (plan.layout.blocks, plan.u, plan.v, plan.rank, plan.slots) == (116, 8, 8, 96, 1)
  kib = lambda nbytes: -(-nbytes // 1024) * 1024  # Pallas aligns each buffer to 1 KiB
  f32, bf16, tile = 4, 2, 64 * 8  # a (64, 8) tile of the block's units or inputs
  wu = 2 * 928 * 4 * 8 * bf16  # [W; U]'s 4u columns
  streamed = 2 * 64 * 32 * bf16  # two chunks of 32 columns
  a_pairs = kib(928 * 8 * bf16)  # one slot's pair of A_i
  b = kib(3 * 8 * 96 * bf16) + kib(2 * 8 * 96 * bf16)  # B_i: 3 rounds on x, 2 on h
  biases = (3 + 2) * tile * f32 + 64 * 32 * f32
  hidden = 64 * 96 * bf16
  states = 4 * tile * f32 + 4 * tile * f32  # c, x, h, m; the four activations
  slices = 4 * tile * (f32 + bf16)  # h_t, g_i on x, g_i on h, a pair of a_i: f32 and bf16
  barriers = 3 * 8
  total = wu + streamed + a_pairs + b + biases + hidden + states + slices + barriers
  assert plan.chunk == 32 and plan.smem_bytes == total == 209_944


def test_the_plan_counts_shared_memory_as_mosaic_gpu_does(monkeypatch):
  """Mosaic GPU refuses a kernel over its bound, naming what it allocates
  (every buffer rounded up to 1 KiB): `Plan.smem_bytes` is that count."""
  from jax.experimental.mosaic.gpu import core

  monkeypatch.setattr(core, '_SMEM_SIZE_BOUND', 1000)
  plan = plan_for(grid_for(3, 24), 12, 20, 2, zigzag=True, cap_input_gate=False,
                  transposed=True)  # fmt: skip
  run = jax.jit(persistent_mogrifier_forward)
  with pytest.raises(ValueError, match=f'smem_bytes={plan.smem_bytes} > max_smem_bytes=1000'):
    jax.export.export(run, platforms=['cuda'])(*_shapes(2, 3, 12, 24, 2, 20))


def _shapes(steps, batch, m, n, rounds, rank, full_rank=False):
  s, f32 = jax.ShapeDtypeStruct, jnp.float32
  kept = []
  for i in range(1, rounds + 1):
    source, target = (n, m) if i % 2 else (m, n)
    low = {'kernel_in': s((source, rank), f32), 'kernel_out': s((rank, target), f32)}
    kept.append({'kernel': s((source, target), f32)} if full_rank else low)
    kept[-1]['bias'] = s((target,), f32)
  weights = s((m, 4 * n), f32), s((4 * n,), f32), s((n, 4 * n), f32)
  return (s((steps, batch, m), f32), kept, *weights, s((batch, n), f32), s((batch, n), f32))


def test_the_persistent_grid_lowers_for_cuda_at_the_recipe_size():
  """T = 70, B = 64, m = n = 912, r = 5, k = 84: Mosaic GPU lowers it
  without a GPU (layout inference, wgmma's operand checks), one launch,
  each mode with the barrier it has (`check_lowered_modes`)."""

  def lowered(mode):
    run = jax.jit(functools.partial(persistent_mogrifier_forward, mode=mode, cap_input_gate=True))
    text = jax.export.export(run, platforms=['cuda'])(*_shapes(70, 64, 912, 912, 5, 84))
    text = text.mlir_module()
    if mode != 'per_step':
      assert text.count('@mosaic_gpu') == 1
    return text

  check_lowered_modes(lowered)


@pytest.mark.parametrize(
  'm, n, rounds, rank, blocks',
  [
    (24, 24, 2, 20, 2),  # 16 units a block: [W; U]'s slice two swizzle tiles wide
    (768, 256, 3, 64, None),  # 768 inputs over 32 blocks: 32 features a block, not 24
    (256, 256, 3, 96, None),  # 12 pairs a round, 36 over 32 blocks: A's pairs in 2 slots
  ],
)
def test_grids_off_the_recipe_lower_their_copies_for_cuda(m, n, rounds, rank, blocks):
  """Mosaic GPU refuses a TMA copy that strides over more than 5 dimensions
  (a (k, 64, 24) float32 tile, an (R, chunks, 32, 64) swizzled operand):
  blocks own a power of two columns and one-off copies of such operands go
  a leading index at a time."""
  run = jax.jit(functools.partial(persistent_mogrifier_forward, blocks=blocks))
  shapes = _shapes(3, 64, m, n, rounds, rank)
  assert '@mosaic_gpu' in jax.export.export(run, platforms=['cuda'])(*shapes).mlir_module()


@pytest.mark.parametrize(
  'change, message',
  [
    (dict(full_rank=True), r"rounds\[0\] is full rank \(\['bias', 'kernel'\]\)"),
    (dict(batch=65), 'batch must be at most 64'),
    (dict(mode='fast'), 'mode must be one of persistent, unfenced, per_step, no_barrier'),
    (dict(blocks=2), "mode='persistent' with blocks=2 cannot run interpreted"),
    (
      dict(m=912, n=912, rank=84, blocks=58),
      r'm=912, n_pad=928, rank=84, rounds=5 on blocks=58 need 394264 bytes of shared memory',
    ),
  ],
)
def test_refuses_what_it_cannot_run_naming_the_argument(change, message):
  size = {k: change.get(k, v) for k, v in dict(batch=3, m=5, n=8, rank=4).items()}
  shapes = _shapes(1, size['batch'], size['m'], size['n'], 5, size['rank'],
                   change.get('full_rank', False))  # fmt: skip
  run = functools.partial(
    persistent_mogrifier_forward,
    blocks=change.get('blocks', 1),
    mode=change.get('mode', 'persistent'),
    interpret=INTERPRET,
  )
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(run, *shapes)


def test_the_kernels_refuse_settings_they_cannot_run_on_construction():
  with pytest.raises(ValueError, match='interpret must be None .* got True'):
    PersistentMogrifierKernels('per_step', True)
  with pytest.raises(ValueError, match='blocks must be a whole number >= 1, or None .* got 0'):
    PersistentMogrifierKernels('per_step', INTERPRET, blocks=0)
  with pytest.raises(ValueError, match="mode must be one of .* got 'fast'"):
    PersistentMogrifierKernels('fast', INTERPRET)


def test_the_kernel_refuses_an_interpret_that_is_not_the_interpreters():
  """Only None lays the operands out for the GPU (transposed): interpret=False
  compiled the interpreter's layouts."""
  shapes = _shapes(1, 3, 5, 8, 5, 4, False)
  run = functools.partial(persistent_mogrifier_forward, blocks=1, interpret=False)
  with pytest.raises(ValueError, match=r'interpret must be None .* got False\b'):
    jax.eval_shape(run, *shapes)
