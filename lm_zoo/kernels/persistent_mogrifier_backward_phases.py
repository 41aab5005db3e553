"""The kernel of `persistent_mogrifier_backward`: its plan (padded sizes,
chunks, shared memory), its phases and the launch that runs them.

A step (in reverse) is 2r + 2 phases with a grid barrier between each two
(2r + 1 crossings; the last phase of a step needs none before the next
step's first, which reads only its own block's state): 'cell' (dG_t),
'mix' (d_mixed = dG_t [W; U]ᵀ, then round r's dz), and per round i = r..1
'reduce' (d_hidden_i's columns, by the blocks owning them) and 'source'
(d_hidden_i A_iᵀ on the block's slice, then round i-1's dz, or, after round
1, the step's d_x_t and the carry to step t-1). One launch runs a list of
phases a step over `steps` steps; the state a block carries between phases
(d_c, d_h_next, d_mask, d_x, d_h and the originals' accumulators without
zigzag) lives in shared memory and enters and leaves the launch through
global arrays, so that a launch a phase ('per_step' mode) runs the same code.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.grid_barrier import grid_barrier
from lm_zoo.kernels.persistent_blocks import (
  BUFFERS,
  UNIT_MULTIPLE,
  copy_in,
  copy_in_parts,
  smem_bytes_of,
  streamed_product,
  swizzled,
)
from lm_zoo.kernels.persistent_lstm import GATES, Layout

LSTM_FACTORS = 7  # the four gates' scales, σ(f), dc/dh, dL/dh_t
# d_c, d_h (d_h_next from the step's end to the next cell phase, when d_h is
# not live), d_mask, d_h0 (the originals' accumulator without zigzag)
STATE_H = 4
STATE_X = 2  # d_x, d_x0
INPUTS = ('lf', 'hp', 'rfx', 'rfh', 'wu', 'b', 'ah', 'ax', 'm', 'sh0', 'sx0')
SLOTS = ('dg16', 'dz16', 'dh16')  # what other blocks read: a slot a step (and round)
OUTPUTS = ('dg32', 'dx', 'dz32', 'dh32', *SLOTS, 'sh', 'sx')
SCRATCH = (
  'wu_s', 'buf_s', 'sbuf_s', 'b_s', 'ah_s', 'ax_s', 'lf_s', 'rfx_s', 'rfh_s', 'sh_s', 'sx_s',
  'g16_s', 'zx32', 'zx16', 'zh32', 'zh16', 'd32', 'd16', 'bars', 'sbars', 'bar',
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Plan:
  """The kernel's padded sizes: `layout` the LSTM's (rows, n_pad, G),
  `inputs` m_pad, `rank` k_pad, the rounds, and the chunks of the dG stream
  (`chunk`) and of the dz and d_hidden streams (`small`)."""

  layout: Layout
  inputs: int
  rank: int
  rounds: int
  zigzag: bool
  chunk: int
  small: int

  u = property(lambda self: self.layout.block_units)
  v = property(lambda self: self.inputs // self.layout.blocks)
  width = property(lambda self: max(self.inputs, self.layout.units))  # a dz slot's columns
  pairs = property(lambda self: self.rank // UNIT_MULTIPLE)  # J: d_hidden's 8-column groups
  slots = property(lambda self: -(-self.rounds * self.pairs // self.layout.blocks))
  odd = property(lambda self: (self.rounds + 1) // 2)  # rounds on x (source h)
  even = property(lambda self: max(1, self.rounds // 2))  # on h (source x); r = 1: one unused

  def target(self, i: int) -> int:
    return self.inputs if i % 2 else self.layout.units


def scratch(plan: Plan, transposed: bool):
  """The shared memory of a block, in `SCRATCH` order."""
  rows, n, u, v, k = plan.layout.rows, plan.layout.units, plan.u, plan.v, plan.rank
  f32, bf16 = jnp.float32, jnp.bfloat16

  def operand(lead, width, depth):  # rows read transposed (`_rows_t`)
    if transposed:
      return swizzled((*lead, width, depth), bf16)
    return plgpu.SMEM((*lead, depth, width), bf16)

  return [
    operand((), v + u, GATES * n),
    swizzled((BUFFERS, rows, plan.chunk), bf16),
    swizzled((BUFFERS, rows, plan.small), bf16),
    operand((plan.slots,), UNIT_MULTIPLE, plan.width),
    operand((plan.odd,), u, k),
    operand((plan.even,), v, k),
    plgpu.SMEM((LSTM_FACTORS, rows, u), f32),
    plgpu.SMEM((2, rows, v), f32),
    plgpu.SMEM((2, rows, u), f32),
    plgpu.SMEM((STATE_H, rows, u), f32),
    plgpu.SMEM((STATE_X, rows, v), f32),
    plgpu.SMEM((GATES, rows, u), bf16),
    *(plgpu.SMEM((rows, w), dtype) for w in (v, u) for dtype in (f32, bf16)),
    plgpu.SMEM((rows, UNIT_MULTIPLE), f32),
    plgpu.SMEM((rows, UNIT_MULTIPLE), bf16),
    plgpu.Barrier(num_barriers=BUFFERS),
    plgpu.Barrier(num_barriers=BUFFERS),
    plgpu.Barrier(num_barriers=1),
  ]


def smem_bytes(plan: Plan) -> int:
  """The shared memory a block's `scratch` takes, as Mosaic GPU counts it
  (`smem_bytes_of`)."""
  return smem_bytes_of(scratch(plan, transposed=False))


def _rows_t(rows, cols, transposed: bool):
  """rows[:, cols]ᵀ as wgmma's B operand: compiled, the rows read transposed
  (K-major; N = 8 or u is narrower than a swizzle tile); Pallas' GPU
  interpreter has no transposed operands, so there they come transposed."""
  return rows.at[:, cols].transpose((1, 0)) if transposed else rows.at[cols]


def _stream(copy, buf_s, bars, rows, width: int, chunk: int, shape, transposed: bool):
  """Σ over the chunks of `width` of A[:, chunk] rows[:, chunk]ᵀ, `shape`
  float32: A's chunk c copied by `copy(c, buffer, barrier)`
  (`streamed_product`)."""

  def operand(c):
    return _rows_t(rows, pl.ds(pl.multiple_of(c * chunk, chunk), chunk), transposed)

  return streamed_product(shape, width // chunk, copy, buf_s, bars, operand)


def _send(*pairs):
  """Shared memory stores, then their TMA copies to global memory, waited
  for: written before the barrier's signal, and the buffers free again."""
  plgpu.commit_smem()
  for src, dst in pairs:
    plgpu.copy_smem_to_gmem(src, dst)
  plgpu.wait_smem_to_gmem(0)


class _Phases:
  """A block's phases of step t (`k`: the refs by name; `g`: the block)."""

  def __init__(self, k, plan: Plan, g, transposed: bool):
    self.k, self.plan, self.g, self.transposed = k, plan, g, transposed

  def run(self, name: str, i: int, t):
    getattr(self, name)(i, t)

  def _stream(self, copy, buf_s, bars, rows, width, chunk, shape):
    return _stream(copy, buf_s, bars, rows, width, chunk, shape, self.transposed)

  def cell(self, _, t):
    """dG_t of the block's units (its d_c and d_h_next are its own), to the
    float32 output and the bfloat16 slot every block reads next."""
    k, u, g = self.k, self.plan.u, self.g
    copy_in(k.lf.at[t, g], k.lf_s, k.bar.at[0])
    x = k.lf_s
    d_h = x[6] + k.sh_s[1]
    d_c = k.sh_s[0] + d_h * x[5]
    for j, d in enumerate((d_c, d_c, d_c, d_h)):
      d_gate = x[j] * d
      x[j] = d_gate  # the gates' gradients leave from the scales' place
      k.g16_s[j] = d_gate.astype(jnp.bfloat16)  # whole rows: a column slice is bank-conflicted
    k.sh_s[0] = d_c * x[4]
    gates = [(k.g16_s.at[j], k.dg16.at[t, :, pl.ds((g * GATES + j) * u, u)]) for j in range(GATES)]
    _send((x.at[pl.ds(0, GATES)], k.dg32.at[t, g]), *gates)

  def mix(self, _, t):
    """d_mixed = dG_t [W; U]ᵀ for the block's v features and u units, the
    whole dG_t streamed; then round r's dz."""
    k, plan = self.k, self.plan
    chunk, v = plan.chunk, plan.v

    def copy(c, buffer, bar):
      plgpu.copy_gmem_to_smem(k.read_dg16.at[t, :, pl.ds(c * chunk, chunk)], buffer, bar)

    width = GATES * plan.layout.units
    d = self._stream(copy, k.buf_s, k.bars, k.wu_s, width, chunk, (plan.layout.rows, v + plan.u))
    k.sx_s[0] = d[:, :v]
    k.sh_s[1] = d[:, v:]
    self.dz(plan.rounds, t)

  def dz(self, i: int, t):
    """Round i's dz = d_out ⊙ prev ⊙ g ⊙ (1 - g/2) and d_out ⊙ g on the
    block's slice of its target (x for odd i, h for even)."""
    k, plan, g = self.k, self.plan, self.g
    odd = i % 2
    state, factors_g, factors_s = (k.sx_s, k.rfx, k.rfx_s) if odd else (k.sh_s, k.rfh, k.rfh_s)
    z32, z16, w = (k.zx32, k.zx16, plan.v) if odd else (k.zh32, k.zh16, plan.u)
    copy_in(factors_g.at[t, (i - 1) // 2, g], factors_s, k.bar.at[0])
    at = 0 if odd else 1
    d_out, gated, gate = state[at], factors_s[0], factors_s[1]
    z = d_out * gated * gate * (1 - gate / 2)
    state[at] = d_out * gate
    z32[...] = z
    z16[...] = z.astype(jnp.bfloat16)
    cols = pl.ds(g * w, w)
    _send((z32, k.dz32.at[t, i - 1, :, cols]), (z16, k.dz16.at[t, i - 1, :, cols]))

  def reduce(self, i: int, t):
    """d_hidden_i[:, 8j:8j+8] = dz_i B_i[8j:8j+8]ᵀ for the pairs (i, j) of
    this block's slots (pair p = (i-1) J + j is slot p // G of block p mod G)."""
    k, plan = self.k, self.plan
    blocks, pairs, small = plan.layout.blocks, plan.pairs, plan.small
    for s in range(plan.slots):
      if s * blocks >= i * pairs or (s + 1) * blocks <= (i - 1) * pairs:
        continue  # no block's slot s is in round i
      j = s * blocks + self.g - (i - 1) * pairs

      def copy(c, buffer, bar):
        plgpu.copy_gmem_to_smem(k.read_dz16.at[t, i - 1, :, pl.ds(c * small, small)], buffer, bar)

      @pl.when((j >= 0) & (j < pairs))
      def _(s=s, j=j, copy=copy):
        shape = (plan.layout.rows, UNIT_MULTIPLE)
        d = self._stream(copy, k.sbuf_s, k.sbars, k.b_s.at[s], plan.target(i), small, shape)
        k.d32[...] = d
        k.d16[...] = d.astype(jnp.bfloat16)
        cols = pl.ds(j * UNIT_MULTIPLE, UNIT_MULTIPLE)
        _send((k.d32, k.dh32.at[t, i - 1, :, cols]), (k.d16, k.dh16.at[t, i - 1, :, cols]))

  def source(self, i: int, t):
    """d_source = d_hidden_i A_i[the block's source rows]ᵀ, added to d_h
    (odd i) or d_x, or without zigzag to the originals' accumulators; then
    round i-1's dz, or after round 1 the step's end."""
    k, plan = self.k, self.plan
    small, odd = plan.small, i % 2

    def copy(c, buffer, bar):
      plgpu.copy_gmem_to_smem(k.read_dh16.at[t, i - 1, :, pl.ds(c * small, small)], buffer, bar)

    rows = k.ah_s.at[(i - 1) // 2] if odd else k.ax_s.at[i // 2 - 1]
    shape = (plan.layout.rows, plan.u if odd else plan.v)
    d = self._stream(copy, k.sbuf_s, k.sbars, rows, plan.rank, small, shape)
    state = k.sh_s if odd else k.sx_s
    at = (1 if odd else 0) if plan.zigzag else (3 if odd else 1)
    first = not plan.zigzag and i + 2 > plan.rounds  # the accumulator's first term
    state[at] = d if first else state[at] + d
    if i > 1:
      self.dz(i - 1, t)
    else:
      self.finish(t)

  def finish(self, t):
    """d_x_t out; d_h_in, the gradient of m ⊙ h_{t-1}: the mask's gradient
    and d_h_next (d_c ⊙ σ(f) is the cell phase's)."""
    k, plan, g = self.k, self.plan, self.g
    separate_x, separate_h = not plan.zigzag and plan.rounds > 1, not plan.zigzag
    k.zx32[...] = k.sx_s[0] + k.sx_s[1] if separate_x else k.sx_s[0]
    d_h_in = k.sh_s[1] + k.sh_s[3] if separate_h else k.sh_s[1]
    # h_{t-1} and m, in buffers free at this phase
    copy_in(k.hp.at[t, g], k.rfh_s.at[0], k.bar.at[0])
    copy_in(k.m.at[:, pl.ds(g * plan.u, plan.u)], k.rfh_s.at[1], k.bar.at[0])
    k.sh_s[2] = k.sh_s[2] + d_h_in * k.rfh_s[0]
    k.sh_s[1] = d_h_in * k.rfh_s[1]
    _send((k.zx32, k.dx.at[t, :, pl.ds(g * plan.v, plan.v)]))


def step_phases(rounds: int):
  """A step's phases in order, (name, round): 2r + 2 of them."""
  rounds_back = [(p, i) for i in range(rounds, 0, -1) for p in ('reduce', 'source')]
  return (('cell', 0), ('mix', 0), *rounds_back)


def _body(*refs, plan: Plan, steps: int, phases, mode: str, transposed: bool, slots_in: bool):
  names = INPUTS + (tuple(f'read_{s}' for s in SLOTS) if slots_in else ()) + OUTPUTS + SCRATCH
  k = SimpleNamespace(**dict(zip(names, refs, strict=True)))
  if not slots_in:  # one launch: the slots are read where the other blocks wrote them
    for s in SLOTS:
      setattr(k, f'read_{s}', getattr(k, s))
  g = jax.lax.axis_index('blocks')
  for src, dst in ((k.wu, k.wu_s), (k.b, k.b_s), (k.ah, k.ah_s), (k.ax, k.ax_s), (k.sh0, k.sh_s),
                   (k.sx0, k.sx_s)):  # fmt: skip
    (copy_in_parts if len(dst.shape) > 2 else copy_in)(src.at[g], dst, k.bar.at[0])
  sync = grid_barrier(mode, plan.layout.blocks)
  run = _Phases(k, plan, g, transposed)
  crossings = len(phases) - 1

  @pl.loop(0, steps)
  def _step(s):
    t = steps - 1 - s
    for j, (name, i) in enumerate(phases):
      if j and sync is not None:
        sync.wait(s * crossings + j)
      run.run(name, i, t)
      if j < crossings and sync is not None:
        sync.arrive()

  _send((k.sh_s, k.sh.at[g]), (k.sx_s, k.sx.at[g]))


def launch(plan: Plan, steps: int, phases, mode: str, interpret, slots_in: bool):
  """The kernel running `phases` each of `steps` steps (t = steps-1 .. 0):
  (`INPUTS`, and with `slots_in` the slots to read) -> `OUTPUTS`."""
  rows, n, u, v, r = plan.layout.rows, plan.layout.units, plan.u, plan.v, plan.rounds
  f32, bf16, s = jnp.float32, jnp.bfloat16, jax.ShapeDtypeStruct
  transposed = interpret is None
  body = functools.partial(
    _body,
    plan=plan,
    steps=steps,
    phases=tuple(phases),
    mode=mode,
    transposed=transposed,
    slots_in=slots_in,
  )
  out_type = (
    s((steps, plan.layout.blocks, GATES, rows, u), f32),
    s((steps, rows, plan.inputs), f32),
    s((steps, r, rows, plan.width), f32),
    s((steps, r, rows, plan.rank), f32),
    s((steps, rows, GATES * n), bf16),
    s((steps, r, rows, plan.width), bf16),
    s((steps, r, rows, plan.rank), bf16),
    s((plan.layout.blocks, STATE_H, rows, u), f32),
    s((plan.layout.blocks, STATE_X, rows, v), f32),
  )
  return plgpu.kernel(
    body,
    out_type=out_type,
    scratch_types=scratch(plan, transposed),
    grid=(plan.layout.blocks,),
    grid_names=('blocks',),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret,
  )
