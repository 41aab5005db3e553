"""The sizes, shared memory and phases of `persistent_mogrifier`'s kernel: what
one block does in a round's reduce and update phases and in the gates' phase,
shared by the persistent launch and the launches a phase at a time."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.common import gate_update, sigmoid
from lm_zoo.kernels.persistent_blocks import (
  BUFFERS,
  K_MULTIPLE,
  SMEM_BYTES,
  block_width,
  copy_in,
  copy_in_parts,
  smem_bytes_of,
  streamed_product,
  swizzled,
)
from lm_zoo.kernels.persistent_lstm import GATES, Layout

PAIR = 8  # the low-rank hidden's columns a reduce pair computes (wgmma's smallest N)
CHUNK_LIMIT = 128  # columns of a streamed operand a buffer holds: 64 x 128 bfloat16
MAX_N = 256  # wgmma's largest N
MISC = BUFFERS  # the barrier of the one-off copies (weights, state, a_i, x_t)
# The weights a block copies once (`Smem`'s names), in the kernels' argument order.
WEIGHTS = ('wu', 'a', 'bx', 'bh', 'bias_x', 'bias_h', 'bias_g', 'm')


@dataclasses.dataclass(frozen=True)
class Plan:
  """The kernel's static sizes and settings.

  Attributes:
    layout: rows (64), n_pad and G, as the LSTM kernel's.
    inputs: m_pad, G blocks of v input features.
    rank: k_pad, the low-rank hidden's columns (J = k_pad / 8 pairs a round).
    rounds: r >= 1.
    zigzag: False: every round's source is h^0 or x_t.
    cap_input_gate: the capped input gate.
    chunk: the columns a streamed operand's buffer holds.
    transposed: wgmma's narrow B operands stored K-major (compiled; Pallas'
      GPU interpreter has no transposed operands).
  """

  layout: Layout
  inputs: int
  rank: int
  rounds: int
  zigzag: bool
  cap_input_gate: bool
  chunk: int
  transposed: bool

  @property
  def u(self) -> int:
    return self.layout.block_units

  @property
  def v(self) -> int:
    return self.inputs // self.layout.blocks

  @property
  def groups(self) -> int:
    return self.rank // PAIR

  @property
  def slots(self) -> int:
    """The (round, group) pairs a block may hold: pair p goes to block p mod G."""
    return -(-self.rounds * self.groups // self.layout.blocks)

  @property
  def x_rounds(self) -> int:
    return max(1, (self.rounds + 1) // 2)

  @property
  def h_rounds(self) -> int:
    return max(1, self.rounds // 2)  # one unused slot when r = 1: no zero-sized arrays

  @property
  def widest(self) -> int:
    return max(self.inputs, self.layout.units)

  def source_width(self, i: int) -> int:
    """Round i's source: h (n_pad) for odd i, x (m_pad) for even."""
    return self.layout.units if i % 2 else self.inputs

  @property
  def smem_bytes(self) -> int:
    """The shared memory a block takes, as Mosaic GPU counts it (`smem_bytes_of`)."""
    return smem_bytes_of(scratch_types(self))


def plan_for(layout: Layout, inputs: int, rank: int, rounds: int, **settings) -> Plan:
  """The plan for m = `inputs` and the largest rank `rank` on `layout`'s grid.
  Raises ValueError naming what does not fit."""
  blocks = layout.blocks
  v = block_width(inputs, blocks)
  if v > MAX_N:
    raise ValueError(f'blocks={blocks} gives each block {v} of {inputs} inputs; at most {MAX_N}')
  m_pad, n_pad = blocks * v, layout.units
  widths = math.gcd(m_pad, n_pad)
  chunk = max(c for c in range(K_MULTIPLE, CHUNK_LIMIT + 1, K_MULTIPLE) if widths % c == 0)
  k_pad = -(-rank // K_MULTIPLE) * K_MULTIPLE
  plan = Plan(layout, m_pad, k_pad, rounds, chunk=chunk, **settings)
  if plan.smem_bytes > SMEM_BYTES:
    raise ValueError(
      f'm={inputs}, n_pad={n_pad}, rank={rank}, rounds={rounds} on blocks={blocks} need '
      f'{plan.smem_bytes} bytes of shared memory a block (at most {SMEM_BYTES}): '
      'use a smaller rank or more blocks'
    )
  return plan


class Smem(NamedTuple):
  """A block's shared memory, in `scratch_types`' order."""

  wu: object  # [W; U]'s 4u columns, (m_pad + n_pad, 4u) in chunks of rows
  buf: object  # the streamed operand's buffers, (2, 64, chunk)
  a: object  # A_i[:, 8 columns] of the block's pairs, (slots, chunks, ...)
  bx: object  # B_i[:, the block's v inputs], odd rounds
  bh: object  # B_i[:, the block's u units], even rounds
  bias_x: object  # (odd rounds, 64, v), rows alike
  bias_h: object  # (even rounds, 64, u)
  bias_g: object  # the gates' bias, (64, 4u)
  hidden: object  # a_i whole, bfloat16 (64, k_pad)
  c: object
  x: object  # the block's slice of x^i, float32 (64, v)
  h: object  # of h^i (m ⊙ h_{t-1} at a step's start), float32 (64, u)
  m: object  # the state mask's slice
  acts: object  # (4, 64, u)
  h32: object  # h_t's slice
  h16: object  # m ⊙ h_t's, bfloat16
  gx: object  # g_i's slice (odd rounds), float32
  px: object  # x^i's, bfloat16
  gh: object
  ph: object
  a32: object  # a pair's 8 columns of a_i, float32
  a16: object  # and bfloat16
  bars: object


def narrow_operand(plan: Plan, lead: tuple[int, ...], n: int, k: int):
  """wgmma's B operands of n < 32 columns: K-major (*lead, n, k), read
  transposed, compiled; (*lead, k, n) interpreted."""
  if plan.transposed:
    return swizzled((*lead, n, k), jnp.bfloat16)
  return plgpu.SMEM((*lead, k, n), jnp.bfloat16)


def scratch_types(plan: Plan) -> list:
  rows, u, v, k = plan.layout.rows, plan.u, plan.v, plan.rank
  f32, bf16 = jnp.float32, jnp.bfloat16
  tile = lambda w, dtype=f32: plgpu.SMEM((rows, w), dtype)
  return [
    swizzled(((plan.inputs + plan.layout.units) // plan.chunk, plan.chunk, GATES * u), bf16),
    swizzled((BUFFERS, rows, plan.chunk), bf16),
    narrow_operand(plan, (plan.slots, plan.widest // plan.chunk), PAIR, plan.chunk),
    narrow_operand(plan, (plan.x_rounds,), v, k),
    narrow_operand(plan, (plan.h_rounds,), u, k),
    plgpu.SMEM((plan.x_rounds, rows, v), f32),
    plgpu.SMEM((plan.h_rounds, rows, u), f32),
    tile(GATES * u),
    swizzled((rows, k), bf16),
    *(tile(w) for w in (u, v, u, u)),
    plgpu.SMEM((GATES, rows, u), f32),
    tile(u),
    tile(u, bf16),
    tile(v),
    tile(v, bf16),
    tile(u),
    tile(u, bf16),
    tile(PAIR),
    tile(PAIR, bf16),
    plgpu.Barrier(num_barriers=BUFFERS + 1),
  ]


def from_columns(ref):
  """A copier of `ref`'s (64, ...) column chunks: copy(cols, buffer, barrier)."""
  return lambda cols, buffer, bar: plgpu.copy_gmem_to_smem(ref.at[:, cols], buffer, bar)


class Block:
  """One block's phases: its shared memory `s`, its index `g` and the plan."""

  def __init__(self, plan: Plan, smem: Smem, g):
    self.plan, self.s, self.g = plan, smem, g
    self.units = pl.ds(g * plan.u, plan.u)
    self.features = pl.ds(g * plan.v, plan.v)

  def load_weights(self, weights: dict):
    """The block's slices of `weights` (a `Smem` field's name: its (G, ...)
    array, `WEIGHTS`), the mask's ('m') of its (64, n_pad)."""
    for name, ref in weights.items():
      src = ref.at[:, self.units] if name == 'm' else ref.at[self.g]
      dst = getattr(self.s, name)
      copy = copy_in_parts if len(dst.shape) > 2 else copy_in
      copy(src, dst, self.s.bars.at[MISC])

  def copy_state(self, state: dict, into_smem: bool):
    """The slices of c, x^i and h^i (`Smem` names: (64, width) arrays)
    into shared memory, or back to the arrays."""
    for name, ref in state.items():
      cols = ref.at[:, self.features if name == 'x' else self.units]
      if into_smem:
        copy_in(cols, getattr(self.s, name), self.s.bars.at[MISC])
      else:
        plgpu.copy_smem_to_gmem(getattr(self.s, name), cols)
    if not into_smem:
      plgpu.wait_smem_to_gmem(0)

  def load_input(self, x):
    """x_t's slice, (64, m_pad) float32: x^{-1}, what round 1 gates."""
    copy_in(x.at[:, self.features], self.s.x, self.s.bars.at[MISC])

  def _narrow(self, ref):
    """A `narrow_operand`'s (k, n) or (n, k) slot as wgmma's B operand."""
    return ref.transpose((1, 0)) if self.plan.transposed else ref

  def _streamed(self, columns: int, chunks: int, copy, operand):
    """Σ_k buffer_k @ operand(k), (64, columns) float32 (`streamed_product`)."""
    shape = (self.plan.layout.rows, columns)
    return streamed_product(shape, chunks, copy, self.s.buf, self.s.bars, operand)

  def reduce(self, i: int, copy_source, a32, a16):
    """Round i's reduce phase: for each of the block's pairs (i, j),
    a_i[:, 8j:8j+8] = bf16(source) @ bf16(A_i[:, 8j:8j+8]) into a32 and a16
    ((64, k_pad) each); `copy_source(cols, buffer, barrier)` copies the
    published source's columns."""
    plan, s = self.plan, self.s
    chunk, blocks, groups = plan.chunk, plan.layout.blocks, plan.groups
    copy = lambda k, buffer, bar: copy_source(pl.ds(k * chunk, chunk), buffer, bar)
    for slot in range(plan.slots):
      first, last = (i - 1) * groups, i * groups  # round i's pairs
      if slot * blocks >= last or (slot + 1) * blocks <= first:
        continue  # no block holds one of round i's pairs in this slot
      pair = self.g + slot * blocks

      @pl.when((pair >= first) & (pair < last))
      def _():
        cols = pl.ds((pair - first) * PAIR, PAIR)
        operand = lambda k: self._narrow(s.a.at[slot, k])
        a = self._streamed(PAIR, plan.source_width(i) // chunk, copy, operand)
        s.a32[...] = a
        s.a16[...] = a.astype(jnp.bfloat16)
        plgpu.commit_smem()  # the stores above, before TMA reads them
        plgpu.copy_smem_to_gmem(s.a32, a32.at[:, cols])
        plgpu.copy_smem_to_gmem(s.a16, a16.at[:, cols])
        plgpu.wait_smem_to_gmem(0)  # before the next pair's stores

  def update(self, i: int, hidden, published, gate_out):
    """Round i's update phase: z = bf16(a_i) @ bf16(B_i[:, slice]) + b_i's
    slice, g = 2σ(z), the block's slice of x^i (odd i) or h^i ← g ⊙ itself;
    the slice into `published` (bfloat16) and g into `gate_out` (float32),
    each (64, width)."""
    s, k = self.s, (i - 1) // 2
    if i % 2:
      b, bias, run, g_s, p_s, cols = s.bx, s.bias_x, s.x, s.gx, s.px, self.features
    else:
      b, bias, run, g_s, p_s, cols = s.bh, s.bias_h, s.h, s.gh, s.ph, self.units
    copy_in(hidden, s.hidden, s.bars.at[MISC])

    def product(acc):
      plgpu.wgmma(acc, s.hidden, self._narrow(b.at[k]))
      return acc[...]

    width = self.plan.v if i % 2 else self.plan.u
    z = pl.run_scoped(product, plgpu.ACC((self.plan.layout.rows, width))) + bias[k]
    gate = 2.0 * sigmoid(z)
    new = gate * run[...]
    run[...] = new
    g_s[...] = gate
    p_s[...] = new.astype(jnp.bfloat16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(g_s, gate_out.at[:, cols])
    plgpu.copy_smem_to_gmem(p_s, published.at[:, cols])
    plgpu.wait_smem_to_gmem(0)  # written before the block arrives

  def gates(self, copy_x, copy_h, hs, history, acts, cs):
    """The gates' phase: bf16([x^↑, h^↑]) @ bf16([W; U] slice) + b, streamed
    from `copy_x`'s m_pad and `copy_h`'s n_pad columns, the cell update;
    h_t into `hs`, m ⊙ h_t into `history` (bfloat16) and the block's h^0 of
    the next step, the activations into `acts` (G, 4, 64, u), c_t into `cs`."""
    plan, s, u = self.plan, self.s, self.plan.u
    chunk, x_chunks = plan.chunk, plan.inputs // plan.chunk

    def copy(k, buffer, bar):
      @pl.when(k < x_chunks)
      def _():
        copy_x(pl.ds(k * chunk, chunk), buffer, bar)

      @pl.when(k >= x_chunks)
      def _():
        copy_h(pl.ds((k - x_chunks) * chunk, chunk), buffer, bar)

    chunks = (plan.inputs + plan.layout.units) // chunk
    gates = self._streamed(GATES * u, chunks, copy, lambda k: s.wu.at[k]) + s.bias_g[...]
    split = [gates[:, k * u : (k + 1) * u] for k in range(GATES)]
    act, c, h = gate_update(split, s.c[...], plan.cap_input_gate)
    s.c[...] = c
    s.h32[...] = h
    masked = h * s.m[...]
    s.h[...] = masked
    s.h16[...] = masked.astype(jnp.bfloat16)  # what the next step's round 1 reads
    for k, a in enumerate(act):
      s.acts[k] = a
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(s.h32, hs.at[:, self.units])
    plgpu.copy_smem_to_gmem(s.h16, history.at[:, self.units])
    plgpu.copy_smem_to_gmem(s.acts, acts.at[self.g])
    plgpu.copy_smem_to_gmem(s.c, cs.at[:, self.units])
    plgpu.wait_smem_to_gmem(0)
