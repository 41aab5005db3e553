"""The Mogrifier LSTM's persistent backward kernel without a GPU: run in
Pallas' GPU interpreter (one block over a whole window, or several blocks a
launch a phase: the interpreter has no semaphores) against
`mixed_lstm_backward_chain` with `MogrifierRounds(r, zigzag, jnp.bfloat16)`
and bfloat16 gate products, from `mixed_lstm_forward`'s residuals; lowered
for CUDA through `jax.export` at the 24M recipe's size; its refusals."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.cells.mixed_lstm_recurrence import mixed_lstm_backward_chain, mixed_lstm_forward
from lm_zoo.cells.mogrifier import MogrifierRounds, round_name
from lm_zoo.cells.persistent_mogrifier import chain_factors
from lm_zoo.kernels.persistent_mogrifier_backward import persistent_mogrifier_backward, plan_for
from lm_zoo.kernels.persistent_mogrifier_backward_phases import smem_bytes

INTERPRET = plgpu.InterpretGPUParams()


def _normal(rng, shape, scale=1.0):
  return jnp.asarray(scale * rng.normal(size=shape), jnp.float32)


def _window(seed, steps, batch, m, n, rounds, rank, zigzag, cap):
  """The kernel's arguments (a forward pass run, its factors, random
  cotangents, a dropout mask of zeros and 1 / 0.6) and the reference's
  outputs."""
  rng = np.random.default_rng(seed)
  inputs, bias = _normal(rng, (steps, batch, m)), _normal(rng, (4 * n,), 0.1)
  w, u = _normal(rng, (m, 4 * n), 0.3), _normal(rng, (n, 4 * n), 0.3)
  carry = (_normal(rng, (batch, n)), jnp.tanh(_normal(rng, (batch, n))))
  mask = jnp.asarray(rng.binomial(1, 0.6, (batch, n)) / 0.6, jnp.float32)
  round_params = []
  for i in range(1, rounds + 1):
    source, target = (n, m) if i % 2 else (m, n)
    round_params.append(
      {
        'kernel_in': _normal(rng, (source, rank), 0.4),
        'kernel_out': _normal(rng, (rank, target), 0.4),
        'bias': _normal(rng, (target,), 0.1),
      }
    )
  mix = MogrifierRounds(rounds, zigzag, jnp.bfloat16)
  named = {round_name(i): p for i, p in enumerate(round_params, start=1)}
  hs, _, per_step = mixed_lstm_forward(
    inputs, w, bias, u, carry, mix, named, mask, jnp.bfloat16, cap
  )
  cotangents = (_normal(rng, hs.shape), (_normal(rng, (batch, n)), _normal(rng, (batch, n))))
  want = mixed_lstm_backward_chain(
    cotangents, inputs, w, u, carry, mix, named, mask, hs, per_step, jnp.bfloat16, cap
  )
  factors = chain_factors(inputs, carry, mask, hs, per_step, mix, cap)
  return (cotangents, *factors, round_params, w, u, mask), want


def _assert_close(got, want, tol=2e-5):
  for got_part, want_part in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(got_part, want_part, rtol=tol, atol=tol)


@pytest.mark.parametrize(
  'sizes, zigzag, cap, blocks, mode',
  [
    ((3, 3, 5, 8, 3, 4), True, False, 1, 'persistent'),
    ((3, 3, 5, 8, 3, 4), False, True, 1, 'persistent'),
    # k_pad 64: 8 column groups a round, 16 (round, group) pairs on 2 blocks;
    # m_pad 96: dz_1 streams in 3 chunks of 32 (a buffer refilled)
    ((2, 3, 70, 24, 2, 40), True, False, 2, 'per_step'),
    # 5 rounds of 4 groups: 20 pairs on 4 blocks of 8 units and 8 features
    ((2, 3, 12, 24, 5, 20), False, True, 4, 'per_step'),
  ],
)
def test_the_backward_chain_is_mixed_lstm_backward_chain(sizes, zigzag, cap, blocks, mode):
  """Every output (d_c0, d_h0, d_mask, dG, dL/dx_t and the rounds' stash)
  to float32 rounding; a state mask with zeros throughout."""
  args, want = _window(sum(sizes), *sizes, zigzag, cap)
  got = persistent_mogrifier_backward(
    *args, zigzag=zigzag, blocks=blocks, mode=mode, interpret=INTERPRET
  )
  _assert_close(got, want)


def _shapes(steps, batch, m, n, rounds, rank):
  """Shape-only arguments of `persistent_mogrifier_backward`."""
  s, f32 = jax.ShapeDtypeStruct, jnp.float32
  round_params = []
  for i in range(1, rounds + 1):
    source, target = (n, m) if i % 2 else (m, n)
    round_params.append({'kernel_in': s((source, rank), f32), 'kernel_out': s((rank, target), f32)})
  block, state = s((steps, batch, n), f32), s((batch, n), f32)
  factors = (block, block, s((steps, batch, 4 * n), f32))
  round_factors = [(s((steps, batch, w), f32),) * 2 for w in ([m, n] * rounds)[:rounds]]
  cotangents = (block, (state, state))
  kernels = (s((m, 4 * n), f32), s((n, 4 * n), f32))
  return (cotangents, factors, block, round_factors, round_params, *kernels, state)


def _lowered(sizes, mode):
  run = jax.jit(functools.partial(persistent_mogrifier_backward, mode=mode))
  return jax.export.export(run, platforms=['cuda'])(*_shapes(*sizes)).mlir_module()


RECIPE = (70, 64, 912, 912, 5, 84)  # the 24M recipe's window, batch, sizes, rounds, rank


def test_the_recipe_fits_an_sm():
  """n = m = 912 padded to 928 on 116 blocks of 8 units and 8 features, k
  padded to 96, dG in chunks of 128 columns and dz, d_hidden in 32."""
  plan = plan_for(64, 912, 912, 84, 5, True)
  assert (plan.layout.blocks, plan.u, plan.v, plan.rank) == (116, 8, 8, 96)
  assert (plan.chunk, plan.small, plan.slots) == (128, 32, 1)
  kib = lambda nbytes: -(-nbytes // 1024) * 1024  # Pallas aligns each buffer to 1 KiB
  f32, bf16, tile = 4, 2, 64 * 8  # a (64, 8) tile of the block's units or inputs
  wu = (8 + 8) * 4 * 928 * bf16  # [W; U]'s rows of the block's inputs and units
  streamed = 2 * 64 * (128 + 32) * bf16  # two chunks of dG, two of dz / d_hidden
  d_hidden = kib(8 * 928 * bf16)  # one slot of A_i's 8 rows
  b = kib(3 * 8 * 96 * bf16) + kib(2 * 8 * 96 * bf16)  # B_i: 3 rounds on x, 2 on h
  factors = (7 + 2 + 2) * tile * f32  # the LSTM's seven, the rounds' on x and on h
  states = (4 + 2) * tile * f32 + 4 * tile * bf16  # d_c, d_h, ...; d_x, d_x0; dG's slice
  slices = 3 * tile * (f32 + bf16)  # dz on x, on h, a pair of d_hidden
  barriers = (2 + 2 + 1) * 8
  total = wu + streamed + d_hidden + b + factors + states + slices + barriers
  assert smem_bytes(plan) == total == 231_464


def test_the_plan_counts_shared_memory_as_mosaic_gpu_does(monkeypatch):
  """Mosaic GPU refuses a kernel over its bound, naming what it allocates:
  `smem_bytes` is that count."""
  from jax.experimental.mosaic.gpu import core

  monkeypatch.setattr(core, '_SMEM_SIZE_BOUND', 1000)
  sizes = (2, 3, 12, 24, 2, 20)
  plan = plan_for(3, 12, 24, 20, 2, True)
  with pytest.raises(ValueError, match=f'smem_bytes={smem_bytes(plan)} > max_smem_bytes=1000'):
    _lowered(sizes, 'persistent')


def test_the_persistent_backward_lowers_for_cuda_with_its_semaphore():
  """At the recipe's size, one Mosaic GPU launch with the semaphore (a
  release add, a polling load) and the proxy fence; without the barrier,
  one launch with neither."""
  text = _lowered(RECIPE, 'persistent')
  assert text.count('@mosaic_gpu') == 1 and 'stablehlo.while' not in text
  assert 'red.release' in text and 'ld.relaxed' in text and 'fence.proxy.async.global' in text
  free = _lowered(RECIPE, 'no_barrier')
  assert free.count('@mosaic_gpu') == 1
  assert 'red.release' not in free and 'ld.relaxed' not in free
  assert 'fence.proxy.async.global' not in free


@pytest.mark.parametrize(
  'm, n, rounds, rank, blocks',
  [
    (768, 256, 3, 64, None),  # 768 inputs over 32 blocks: 32 features a block, not 24
    (24, 24, 4, 64, 2),  # 16 units a block, two rounds of each kind: A_i's rows (2, 16, 64)
  ],
)
def test_grids_off_the_recipe_lower_their_copies_for_cuda(m, n, rounds, rank, blocks):
  """Mosaic GPU refuses a TMA copy that strides over more than 5 dimensions
  (a (k, 64, 24) float32 tile of the factors, A's rows of two rounds
  swizzled): blocks own a power of two columns, and one-off copies of such
  operands go a round at a time."""
  run = jax.jit(functools.partial(persistent_mogrifier_backward, blocks=blocks))
  shapes = _shapes(3, 64, m, n, rounds, rank)
  assert '@mosaic_gpu' in jax.export.export(run, platforms=['cuda'])(*shapes).mlir_module()


def _refused(change, **kwargs):
  args, _ = _window(9, 2, 3, 5, 8, 1, 4, True, False)
  args = list(args)
  for at, value in change.items():
    args[at] = value
  persistent_mogrifier_backward(*args, interpret=INTERPRET, **kwargs)


@pytest.mark.parametrize(
  'change, kwargs, message',
  [
    ({4: [{'kernel': jnp.zeros((8, 5))}]}, {}, r'rounds\[0\] is full rank'),
    ({}, dict(mode='fast'), 'mode must be one of persistent, unfenced, per_step, no_barrier'),
    ({}, dict(blocks=2), "mode='persistent' with blocks=2 cannot run interpreted"),
  ],
)
def test_the_backward_refuses_what_it_cannot_run_naming_the_argument(change, kwargs, message):
  with pytest.raises(ValueError, match=message):
    _refused(change, **kwargs)


def test_the_backward_refuses_a_batch_and_sizes_that_do_not_fit():
  with pytest.raises(ValueError, match='batch must be at most 64'):
    plan_for(65, 8, 8, 4, 1, True)
  with pytest.raises(
    ValueError, match=r'need \d+ bytes of shared memory a block \(at most 232448\)'
  ):
    plan_for(64, 64, 64, 32, 5, True, blocks=1)
