"""The backward chain of an LSTM layer wrapped in the Mogrifier's low-rank
rounds, over a whole window, as ONE persistent Mosaic GPU kernel (Hopper:
TMA copies, wgmma): `mixed_lstm_backward_chain` with `MogrifierRounds(r,
zigzag, jnp.bfloat16)` and bfloat16 gate products.

For t = T-1 down to 0, from the forward's residuals (`mixed_lstm_forward`):

    d_h = dL/dh_t + d_h_next,   d_c = d_c + d_h ⊙ dc/dh_t
    dG_t = s_t ⊙ [d_c, d_c, d_c, d_h],   d_c = d_c ⊙ σ(f_t)
    [d_x, d_h] = dG_t [W; U]ᵀ                       (bfloat16 operands)
    for i = r..1 (d_out = d_x for odd i, d_h for even):
      dz_i = d_out ⊙ prev_i ⊙ g_i ⊙ (1 - g_i/2),  d_out = d_out ⊙ g_i
      d_hidden_i = dz_i B_iᵀ,  d_source = d_hidden_i A_iᵀ      (bfloat16 operands)
      d_h += d_source (odd i) or d_x += d_source; without zigzag, to the
      originals' accumulators, added at the end
    dL/dx_t = d_x,  d_h_in = d_h:  d_mask += d_h_in ⊙ h_{t-1},  d_h_next = d_h_in ⊙ m

(round i = A_i B_i: `kernel_in` (source width, k), `kernel_out` (k, target
width)). Its caller computes what is elementwise over the window before it,
as for `persistent_lstm_backward`: the cell update's factors
(`backward_factors`) and each round's g_i and prev_i, the value it gated
(rebuilt from x_t, m ⊙ h_{t-1} and the kept gates by `mogrify_rounds`:
`lm_zoo.cells.persistent_mogrifier`). It returns dG (T, B, 4n), dL/dx_t, the
rounds' stash (dz_1..dz_r, d_hidden_1..d_hidden_r, as `MogrifierRounds`
packs it) and dL/dc_0, dL/dh_0, dL/dm, all float32.

The grid is the LSTM's (`layout_for`): G blocks, block g owns u hidden units
(their 4u gate columns) and v = m_pad / G input features (`block_width`,
as the forward's), k padded to k_pad (a multiple of 32). A block keeps
in shared memory [W; U]'s rows of its features and units (read transposed,
as `persistent_lstm_backward` reads U's), A_i's rows of its source slice and
B_i's 8 rows of each (round, 8-column group of k_pad) pair it reduces: pair
p = (i-1) k_pad/8 + j belongs to block p mod G, its slot p // G. A step is
2r + 2 phases with 2r + 1 grid barrier crossings (`persistent_mogrifier_backward_phases`):
dG_t (local) published, the whole dG_t streamed through two chunk buffers
against the block's rows; then per round dz_i (local) published, the whole
dz_i streamed by the reducers into d_hidden_i's columns, published, and
d_hidden_i streamed by every block against its A_i rows. Everything another
block reads has its own slot a step (and round), so nothing is overwritten
while read.

Shared memory at the 24M recipe (n = m = 912, k = 84, r = 5, batch 64; n_pad
= m_pad = 928, G = 116, u = v = 8, k_pad = 96, 60 pairs: one slot): [W; U]'s
rows 16 x 3712 x 2 = 116 KiB, dG's buffers 2 x 64 x 128 x 2 = 32 KiB (chunk
128: the largest 32-multiple dividing 3712 that fits), dz's and d_hidden's
2 x 64 x 32 x 2 = 8 KiB (928 = 29 x 32), B's rows 14.5 KiB, A's 7.5 KiB, the
factors, state and outgoing tiles 46 KiB: 231,464 bytes of the 232,448 a
block may have, each buffer rounded up to 1 KiB as Mosaic GPU allocates it
(`smem_bytes`). The chunk loops are `pl.loop`s, not unrolled:
29 to 116 chunks a stream at the recipe's sizes.

Modes (`grid_barrier.MODES`): 'persistent' (one launch, the fenced barrier
at every crossing), 'unfenced', 'no_barrier' (timing only: they may read
stale values with several blocks), and 'per_step': one launch a PHASE (a launch boundary
is the barrier; the state between launches passes through global arrays),
what Pallas' GPU interpreter runs with several blocks, as it has no
semaphores and runs blocks one after another.

Example::

  (d_c0, d_h0, d_mask), (d_gates, d_inputs, stashes) = persistent_mogrifier_backward(
    cotangents, factors, h_prev, round_factors, rounds, W, U, mask
  )
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.kernels.grid_barrier import check_blocks_run, check_mode, one_model_a_launch
from lm_zoo.kernels.persistent_blocks import K_MULTIPLE, SMEM_BYTES, UNIT_MULTIPLE, block_width
from lm_zoo.kernels.persistent_lstm import GATES, by_blocks, layout_for, unblocked_gates
from lm_zoo.kernels.persistent_mogrifier_backward_phases import (
  Plan,
  launch,
  smem_bytes,
  step_phases,
)

CHUNK_LIMIT = 512  # columns a stream buffer holds: 64 x 512 bfloat16 = 64 KiB


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def _chunks(width: int):
  """The multiples of 32 dividing `width`, at most CHUNK_LIMIT, largest first."""
  return [c for c in range(min(width, CHUNK_LIMIT), 0, -1) if c % K_MULTIPLE == 0 and not width % c]


def plan_for(batch: int, m: int, n: int, k: int, rounds: int, zigzag: bool, blocks=None) -> Plan:
  """The padded sizes and chunks; dG's chunk the largest that fits shared
  memory. Raises ValueError naming what does not fit."""
  layout = layout_for(batch, n, blocks)
  inputs = layout.blocks * block_width(m, layout.blocks)
  rank = _round_up(k, K_MULTIPLE)
  small = _chunks(math.gcd(inputs, layout.units, rank))[0]
  plans = [
    Plan(layout, inputs, rank, rounds, zigzag, chunk, small)
    for chunk in _chunks(GATES * layout.units)
  ]
  for plan in plans:
    if smem_bytes(plan) <= SMEM_BYTES:
      return plan
  raise ValueError(
    f'hidden={n}, inputs={m}, rank={k}, rounds={rounds} need {smem_bytes(plans[-1])} bytes of '
    f'shared memory a block (at most {SMEM_BYTES}): use more blocks or smaller sizes'
  )


def _check_args(cotangents, h_prev, round_factors, rounds, input_kernel, recurrent_kernel, mode):
  check_mode(mode)
  if h_prev.ndim != 3 or h_prev.shape[0] < 1:
    raise ValueError(f'h_prev must be (T >= 1, B, n), got {h_prev.shape}')
  steps, batch, n = h_prev.shape
  m = input_kernel.shape[0]
  if not rounds:
    raise ValueError('rounds must hold at least one round (zero rounds: the plain LSTM kernel)')
  for i, p in enumerate(rounds, start=1):
    if 'kernel_in' not in p:
      raise ValueError(f'rounds[{i - 1}] is full rank: the kernel takes low-rank rounds only')
  if len(round_factors) != len(rounds):
    raise ValueError(
      f'round_factors must hold one pair a round ({len(rounds)}), got {len(round_factors)}'
    )
  wanted = {
    'input_kernel': (input_kernel, (m, GATES * n)),
    'recurrent_kernel': (recurrent_kernel, (n, GATES * n)),
    'cotangents[0]': (cotangents[0], (steps, batch, n)),
  }
  for i, p in enumerate(rounds, start=1):
    source, target = (n, m) if i % 2 else (m, n)
    k = rounds[0]['kernel_in'].shape[-1]
    wanted[f'rounds[{i - 1}] kernel_in'] = (p['kernel_in'], (source, k))
    wanted[f'rounds[{i - 1}] kernel_out'] = (p['kernel_out'], (k, target))
    wanted[f'round_factors[{i - 1}]'] = (round_factors[i - 1][0], (steps, batch, target))
  for name, (array, shape) in wanted.items():
    if array.shape != shape:
      raise ValueError(f'{name} must be {shape}, got {array.shape}')


def _by_blocks(parts, rows: int, width: int, blocks: int):
  """(T, B, w) arrays -> (T, G, len(parts), rows, width / G) float32, zero-padded."""
  steps, batch, w = parts[0].shape
  x = jnp.pad(jnp.stack(parts, 1), ((0, 0), (0, 0), (0, rows - batch), (0, width - w)))
  x = x.reshape(steps, len(parts), rows, blocks, width // blocks)
  return jnp.moveaxis(x, 3, 1).astype(jnp.float32)


def _round_factors(round_factors, plan: Plan):
  """Per round (prev_i, g_i) on its target, by blocks: odd rounds (T, r_odd,
  G, 2, 64, v), even (T, r_even, G, 2, 64, u) (zeros when r = 1)."""
  rows, blocks = plan.layout.rows, plan.layout.blocks
  sides = []
  for first, width in ((0, plan.inputs), (1, plan.layout.units)):
    laid = [
      _by_blocks([gated, gate], rows, width, blocks) for gated, gate in round_factors[first::2]
    ]
    sides.append(jnp.stack(laid, 1) if laid else jnp.zeros_like(sides[0][:, :1]))
  return sides


def _weight_rows(input_kernel, recurrent_kernel, rounds, plan: Plan, transposed: bool):
  """Per block: [W; U]'s rows (G, v + u, 4 n_pad), columns by blocks; B_i's
  rows of its pairs (G, slots, 8, width); A_i's rows of its source slice,
  odd rounds (G, r_odd, u, k_pad), even (G, r_even, v, k_pad); bfloat16,
  the last two axes swapped where the interpreter reads them (`_rows_t`)."""
  layout, blocks, rank, bf16 = plan.layout, plan.layout.blocks, plan.rank, jnp.bfloat16

  def rows(kernel, length):
    x = by_blocks(kernel.astype(bf16), layout, (length,))
    return jnp.moveaxis(x, 0, 1).reshape(blocks, length // blocks, -1)

  def padded(a, shape):  # the leading axes zero-padded to `shape`
    pads = [(0, s - d) for d, s in zip(a.shape, shape)]
    return jnp.pad(a, pads + [(0, 0)] * (a.ndim - len(shape))).astype(bf16)

  wu = jnp.concatenate([rows(input_kernel, plan.inputs), rows(recurrent_kernel, layout.units)], 1)
  outs = [padded(p['kernel_out'], (rank, plan.width)) for p in rounds]
  b = padded(jnp.concatenate(outs).reshape(-1, UNIT_MULTIPLE, plan.width), (plan.slots * blocks,))
  b = jnp.swapaxes(b.reshape(plan.slots, blocks, UNIT_MULTIPLE, plan.width), 0, 1)
  sources = []
  for first, length in ((0, layout.units), (1, plan.inputs)):
    a = [padded(p['kernel_in'], (length, rank)) for p in rounds[first::2]] or [
      jnp.zeros((length, rank), bf16)
    ]
    sources.append(jnp.swapaxes(jnp.stack(a).reshape(len(a), blocks, -1, rank), 0, 1))
  arrays = [wu, b, *sources]
  return arrays if transposed else [jnp.swapaxes(a, -1, -2) for a in arrays]


def _phase_by_phase(arrays, plan: Plan, interpret: Any):
  """'per_step': a reverse scan over steps, a launch a phase; the state
  and the slots pass from launch to launch through global arrays."""
  lf, hp, rfx, rfh, *fixed, sh, sx = arrays
  rows, r, f32, bf16 = plan.layout.rows, plan.rounds, jnp.float32, jnp.bfloat16
  phases = step_phases(r)
  kernels = {p: launch(plan, 1, (p,), 'per_step', interpret, slots_in=True) for p in phases}

  def step(state, xs):
    sh, sx = state
    slots = [
      jnp.zeros((1, rows, GATES * plan.layout.units), bf16),
      jnp.zeros((1, r, rows, plan.width), bf16),
      jnp.zeros((1, r, rows, plan.rank), bf16),
    ]
    dg, dx, dz, dh = None, None, jnp.zeros(slots[1].shape, f32), jnp.zeros(slots[2].shape, f32)
    for name, i in phases:
      got = kernels[(name, i)](*(x[None] for x in xs), *fixed, sh, sx, *slots)
      sh, sx = got[-2:]
      if name == 'cell':
        dg, slots[0] = got[0], got[4]
      elif name == 'reduce':
        dh = dh.at[:, i - 1].set(got[3][:, i - 1])
        slots[2] = slots[2].at[:, i - 1].set(got[6][:, i - 1])
      if name == 'mix' or (name == 'source' and i > 1):
        z = (i or r + 1) - 2  # the round whose dz this phase wrote
        dz, slots[1] = dz.at[:, z].set(got[2][:, z]), slots[1].at[:, z].set(got[5][:, z])
      if name == 'source' and i == 1:
        dx = got[1]
    return (sh, sx), (dg[0], dx[0], dz[0], dh[0])

  (sh, _), outs = jax.lax.scan(step, (sh, sx), (lf, hp, rfx, rfh), reverse=True)
  return (*outs, sh)


def _run(arrays, plan: Plan, mode: str, interpret: Any):
  """The launch(es) of `mode`: (dG by blocks, d_x, dz, d_hidden, the final
  state); vmapped, a model at a time (`one_model_a_launch`)."""

  def launches(*arrays):
    if mode == 'per_step':
      return _phase_by_phase(arrays, plan, interpret)
    steps = arrays[0].shape[0]
    kernel = launch(plan, steps, step_phases(plan.rounds), mode, interpret, slots_in=False)
    dg, dx, dz, dh, *_, sh, _ = kernel(*arrays)
    return dg, dx, dz, dh, sh

  return one_model_a_launch(launches)(*arrays)


def _prepare(cotangents, factors, h_prev, round_factors, rounds, weights, mask, plan, transposed):
  """The kernel's inputs (`persistent_mogrifier_backward_phases.INPUTS`), laid out by blocks."""
  d_hs, (d_c_last, d_h_last) = cotangents
  forget, d_c_from_h, scales = factors
  rows, units, blocks = plan.layout.rows, plan.layout.units, plan.layout.blocks
  lf = _by_blocks([*jnp.split(scales, GATES, -1), forget, d_c_from_h, d_hs], rows, units, blocks)
  hp = _by_blocks([h_prev], rows, units, blocks)[:, :, 0]
  rfx, rfh = _round_factors(round_factors, plan)
  fixed = _weight_rows(*weights, rounds, plan, transposed)
  m = jnp.pad(mask, ((0, rows - mask.shape[0]), (0, units - mask.shape[1]))).astype(jnp.float32)
  zeros = jnp.zeros_like(d_c_last)
  sh = _by_blocks([x[None] for x in (d_c_last, d_h_last, zeros, zeros)], rows, units, blocks)
  sx = jnp.zeros((blocks, 2, rows, plan.v), jnp.float32)
  return lf, hp, rfx, rfh, *fixed, m, sh[0], sx


def persistent_mogrifier_backward(
  cotangents,
  factors,
  h_prev: jax.Array,
  round_factors,
  rounds,
  input_kernel: jax.Array,
  recurrent_kernel: jax.Array,
  state_mask: jax.Array,
  *,
  zigzag: bool = True,
  blocks: int | None = None,
  mode: str = 'persistent',
  interpret: Any = None,
):
  """The Mogrifier LSTM's backward chain over a window in one persistent kernel.

  Args:
    cotangents: (dL/dh_1..h_T (T, B, n), (dL/dc_T, dL/dh_T)).
    factors: the cell update's, (σ(f), dc/dh, the gates' scales)
      (`lstm_recurrence.backward_factors`: the capped gate is in them).
    h_prev: h_0..h_{T-1}, (T, B, n), unmasked.
    round_factors: per round i, (prev_i, g_i), each (T, B, its target
      width): the value it gated and its gate (`mogrify_rounds`' trace).
    rounds: r dicts, round i's `LowRankDense` parameters ('kernel_in' (source
      width, k), 'kernel_out' (k, target width); a bias is not needed):
      odd i from h to x, even from x to h. Full rank is refused.
    input_kernel, recurrent_kernel: W (m, 4n) and U (n, 4n); bfloat16 products.
    state_mask: m on the fed-back state, (B, n); B at most 64.
    zigzag: as the forward's: without it d_source goes to the originals.
    blocks, mode, interpret: as `persistent_lstm_backward`'s; 'per_step' is
      a launch a phase here.

  Returns:
    ((dL/dc_0, dL/dh_0, dL/dm), (dG (T, B, 4n), dL/dx_t (T, B, m), the
    rounds' stash (T, B, Σ_i w_i + r k))), all float32.
  """
  _check_args(cotangents, h_prev, round_factors, rounds, input_kernel, recurrent_kernel, mode)
  steps, batch, n = h_prev.shape
  m, k = input_kernel.shape[0], rounds[0]['kernel_in'].shape[-1]
  plan = plan_for(batch, m, n, k, len(rounds), zigzag, blocks)
  check_blocks_run(plan.layout.blocks, mode, interpret)
  mask = jnp.broadcast_to(state_mask, (batch, n)).astype(jnp.float32)
  weights = (input_kernel, recurrent_kernel)
  arrays = _prepare(
    cotangents, factors, h_prev, round_factors, rounds, weights, mask, plan, interpret is None
  )
  dg, dx, dz, dh, sh = _run(arrays, plan, mode, interpret)
  widths = [m if i % 2 else n for i in range(1, len(rounds) + 1)]
  stash = [dz[:, i, :batch, :w] for i, w in enumerate(widths)]
  stash += [dh[:, i, :batch, :k] for i in range(len(rounds))]
  state = jnp.moveaxis(sh, 0, 2).reshape(sh.shape[1], plan.layout.rows, -1)[:, :batch, :n]
  d_gates = unblocked_gates(dg, batch, n)
  return (state[0], state[1], state[2]), (d_gates, dx[:, :batch, :m], jnp.concatenate(stash, -1))
