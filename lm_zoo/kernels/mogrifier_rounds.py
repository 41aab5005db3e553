"""All the Mogrifier's rounds of one time step as one Pallas kernel, forward
and backward.

Forward, for rows x = x_t and h = m ⊙ h_{t-1} (`lm_zoo.cells.mogrifier`):

    odd i:  x^i = 2σ(z_i) ⊙ x^{i-2},  z_i = h^{i-1} A_i B_i + b_i
    even i: h^i = 2σ(z_i) ⊙ h^{i-2},  z_i = x^{i-1} A_i B_i + b_i

(A_i B_i one full-rank matrix at rank 0; with `zigzag=False` every round
reads the original x or h). Each round needs the whole of the previous one's
output, so a program owns whole rows: the grid covers batch tiles, and each
program runs every round over its rows, chunk by chunk along the widths,
writing each new x^i or h^i to a fresh slot of a scratch output (never over
a value it still reads) and meeting its threads at a barrier between rounds.
It returns the mixed rows [x^↑; h^↑], every round's gate 2σ(z_i) and
low-rank hidden h^{i-1} A_i, which the backward pass keeps.

Backward, from dL/d[x^↑; h^↑], the rounds in reverse:

    dz_i = d out_i ⊙ prev_i ⊙ g_i ⊙ (1 - g_i / 2),   d prev_i = d out_i ⊙ g_i,
    d source_i += dz_i B_iᵀ A_iᵀ

with prev_i (x^{i-2} or h^{i-2}) rebuilt from x, h and the kept gates. It
returns dL/dx, dL/dh, and each round's dz_i and dz_i B_iᵀ, from which the
caller forms the rounds' weight gradients over the whole window at once.

Shapes: x (B, M), h (B, N), round i's `kernel_in` (source width, R) and
`kernel_out` (R, gate width), or `kernel` (source width, gate width), and
`bias` (gate width,); B a multiple of the tiles' batch, M and N of the
chunk, R a power of two of at least 16 (the windows pad them so).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.kernels.common import RowProgram, call_by_rows, resolve_interpret, shifted_columns
from lm_zoo.kernels.lstm_step import Tiles


def _gate(z):
  return 1.0 + jnp.tanh(0.5 * z)  # 2σ(z)


class _Version:
  """Where one version of a (rows, width) value lives: a ref, its slot in a
  scratch output (None: the whole ref) and its first column."""

  def __init__(self, ref, slot=None, offset=0):
    self.ref, self.slot, self.offset = ref, slot, offset

  def _index(self, cols):
    cols = shifted_columns(cols, self.offset)
    return (slice(None), cols) if self.slot is None else (self.slot, slice(None), cols)

  def __getitem__(self, cols):
    return self.ref[self._index(cols)]

  def __setitem__(self, cols, value):
    self.ref[self._index(cols)] = value


def _take(refs, counts):
  """Consecutive groups of `refs` of the given sizes."""
  groups, refs = [], list(refs)
  for count in counts:
    groups.append(refs[:count])
    refs = refs[count:]
  return groups


def _round_weights(refs, plan):
  """Each round's (kernel_in, kernel_out, bias) or (kernel, bias), and the rest."""
  weights, refs = [], list(refs)
  for low_rank in plan:
    count = 3 if low_rank else 2
    weights.append(refs[:count])
    refs = refs[count:]
  return weights, refs


def _forward_kernel(x_ref, h_ref, *refs, plan, zigzag, body):
  rounds = len(plan)
  weights, outs = _round_weights(refs, plan)
  (mixed_ref,), gate_refs, hidden_refs, (x_slots, h_slots) = _take(outs, [1, rounds, sum(plan), 2])
  hidden_refs = iter(hidden_refs)
  widths = {1: x_ref.shape[1], 0: h_ref.shape[1]}  # odd rounds gate x, even rounds h
  original = {1: _Version(x_ref), 0: _Version(h_ref)}
  current = dict(original)
  for i, low_rank in enumerate(plan, start=1):
    odd = i % 2
    source = (current if zigzag else original)[1 - odd]
    source_width = widths[1 - odd]
    prev, target = current[odd], _Version(x_slots if odd else h_slots, (i - 1) // 2)
    if low_rank:
      kernel_in, kernel_out, bias = weights[i - 1]
      hidden = body.summed(
        source_width,
        (body.rows, kernel_in.shape[1]),
        lambda c, s=source, k=kernel_in: body.product(s[c], k[c, :]),
      )
      next(hidden_refs)[...] = hidden
      pre = lambda cols, h=hidden, k=kernel_out: body.product(h, k[:, cols])
    else:
      kernel, bias = weights[i - 1]
      pre = lambda cols, s=source, w=source_width, k=kernel: body.summed(
        w, (body.rows, body.chunk), lambda r: body.product(s[r], k[r, cols])
      )

    def write(cols, i=i, pre=pre, bias=bias, prev=prev, target=target):
      gate = _gate(pre(cols) + bias[cols][None, :])
      gate_refs[i - 1][:, cols] = gate
      target[cols] = gate * prev[cols]

    body.each_chunk(widths[odd], write)
    current[odd] = target
    body.barrier()
  mixed_x, mixed_h = _Version(mixed_ref), _Version(mixed_ref, offset=widths[1])
  body.each_chunk(widths[1], lambda cols: mixed_x.__setitem__(cols, current[1][cols]))
  body.each_chunk(widths[0], lambda cols: mixed_h.__setitem__(cols, current[0][cols]))


def _round_back(original, earlier, gate_ref, d_out, d_z_ref, d_prev):
  """Returns `back(cols)`, round i's backward through its gate at a chunk of
  columns: it writes dz_i and d prev_i there and returns dz_i, with prev_i
  rebuilt as the original x or h times the `earlier` rounds' gates."""

  def back(cols):
    prev = original[:, cols]
    for gate_j in earlier:
      prev = prev * gate_j[:, cols]
    gate, d = gate_ref[:, cols], d_out[cols]
    d_z = d * prev * gate * (1 - gate / 2)
    d_z_ref[:, cols] = d_z
    d_prev[cols] = d * gate
    return d_z

  return back


def _source_gradient(body, weights, low_rank, back, width, d_z_ref, d_hidden_refs):
  """Runs `back` over the round's `width` and returns d source_i at a chunk of
  the source: dz_i B_iᵀ A_iᵀ, keeping dz_i B_iᵀ in the next of
  `d_hidden_refs`, or for a full-rank round dz_i Kᵀ."""
  if low_rank:
    kernel_in, kernel_out, _ = weights
    d_hidden = body.summed(
      width,
      (body.rows, kernel_out.shape[0]),
      lambda c: body.product(back(c), kernel_out[:, c], transpose_b=True),
    )
    next(d_hidden_refs)[...] = d_hidden
    return lambda c: body.product(d_hidden, kernel_in[c, :], transpose_b=True)
  kernel, _ = weights
  body.each_chunk(width, back)
  body.barrier()  # d_z is read back whole below
  return lambda c: body.summed(
    width,
    (body.rows, body.chunk),
    lambda r: body.product(d_z_ref[:, r], kernel[c, r], transpose_b=True),
  )


def _backward_kernel(d_mixed_ref, x_ref, h_ref, *refs, plan, zigzag, body):
  rounds = len(plan)
  gate_refs, refs = refs[:rounds], refs[rounds:]
  weights, outs = _round_weights(refs, plan)
  (d_x_ref, d_h_ref), d_z_refs, d_hidden_refs, (x_slots, h_slots, x0_slots, h0_slots) = _take(
    outs, [2, rounds, sum(plan), 4]
  )
  widths = {1: x_ref.shape[1], 0: h_ref.shape[1]}
  originals = {1: x_ref, 0: h_ref}
  current = {1: _Version(d_mixed_ref), 0: _Version(d_mixed_ref, offset=widths[1])}
  into_original = {1: None, 0: None}  # without zigzag: what the rounds send to x and h
  slots, original_slots = {1: x_slots, 0: h_slots}, {1: x0_slots, 0: h0_slots}
  d_hidden_refs = iter(reversed(d_hidden_refs))
  for i in range(rounds, 0, -1):
    low_rank, odd = plan[i - 1], i % 2
    d_out, gate_ref = current[odd], gate_refs[i - 1]
    d_prev = _Version(slots[odd], 2 * (i - 1))
    earlier = [gate_refs[j - 1] for j in range(i - 2, 0, -2)]  # prev_i = x or h ⊙ these
    back = _round_back(originals[odd], earlier, gate_ref, d_out, d_z_refs[i - 1], d_prev)
    d_source = _source_gradient(
      body, weights[i - 1], low_rank, back, widths[odd], d_z_refs[i - 1], d_hidden_refs
    )
    current[odd] = d_prev
    into, sink = (current, slots) if zigzag else (into_original, original_slots)
    other = 1 - odd
    before, after = into[other], _Version(sink[other], 2 * (i - 1) + 1)

    def add(cols, before=before, after=after, d_source=d_source):
      after[cols] = d_source(cols) if before is None else before[cols] + d_source(cols)

    body.each_chunk(widths[other], add)
    into[other] = after
    body.barrier()
  for odd, out in ((1, d_x_ref), (0, d_h_ref)):
    extra = into_original[odd]
    body.each_chunk(
      widths[odd],
      lambda cols, odd=odd, out=out, extra=extra: out.__setitem__(
        (slice(None), cols), current[odd][cols] + (0 if extra is None else extra[cols])
      ),
    )


def _flat_weights(params, plan):
  flat = []
  for p, low_rank in zip(params, plan):
    flat += [p['kernel_in'], p['kernel_out'], p['bias']] if low_rank else [p['kernel'], p['bias']]
  return flat


def _plan(params):
  return tuple('kernel_in' in p for p in params)


def rounds_forward(
  x: jax.Array,
  h: jax.Array,
  params: list[dict],
  *,
  zigzag: bool,
  tiles: Tiles,
  dtype: Any,
  interpret: bool | None = None,
):
  """The rounds of one step: ([x^↑; h^↑] (B, M + N), each round's gate
  (B, its width), each low-rank round's hidden (B, R)).

  Args:
    x, h: x_t and m ⊙ h_{t-1}, (B, M) and (B, N).
    params: per round, `LowRankDense`'s parameters (with a bias).
    zigzag: False: every round reads the original x or h.
    tiles: the rows a program owns (`batch`) and the `chunk`.
    dtype: the products' operand dtype (bfloat16 sums in float32).
    interpret: run in Pallas' interpreter (default: off a GPU).
  """
  interpret = resolve_interpret(interpret)
  plan, (batch, m), n = _plan(params), x.shape, h.shape[1]
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  widths = [m if i % 2 else n for i in range(1, len(plan) + 1)]
  outs = (
    [f32(batch, m + n)]
    + [f32(batch, w) for w in widths]
    + [f32(batch, p['kernel_in'].shape[1]) for p in params if 'kernel_in' in p]
    + [f32(len(plan), batch, m), f32(len(plan), batch, n)]
  )
  body = functools.partial(
    _forward_kernel,
    plan=plan,
    zigzag=zigzag,
    body=RowProgram(tiles.batch, tiles.chunk, dtype, interpret),
  )
  mixed, *rest = call_by_rows(
    body, 'mogrifier_rounds_forward', [x, h], _flat_weights(params, plan), outs, tiles, interpret
  )
  return mixed, rest[: len(plan)], rest[len(plan) : len(plan) + sum(plan)]


def rounds_backward(
  d_mixed: jax.Array,
  x: jax.Array,
  h: jax.Array,
  gates: list[jax.Array],
  params: list[dict],
  *,
  zigzag: bool,
  tiles: Tiles,
  dtype: Any,
  interpret: bool | None = None,
):
  """The rounds of one step, back: (dL/dx (B, M), dL/dh (B, N), each round's
  dz (B, its width), each low-rank round's dz Bᵀ (B, R)).

  Args:
    d_mixed: dL/d[x^↑; h^↑], (B, M + N).
    x, h, params, zigzag, tiles, dtype, interpret: as `rounds_forward`'s.
    gates: each round's gate, as `rounds_forward` returned them.
  """
  interpret = resolve_interpret(interpret)
  plan, (batch, m), n = _plan(params), x.shape, h.shape[1]
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  widths = [m if i % 2 else n for i in range(1, len(plan) + 1)]
  slots = 2 * len(plan)
  outs = (
    [f32(batch, m), f32(batch, n)]
    + [f32(batch, w) for w in widths]
    + [f32(batch, p['kernel_in'].shape[1]) for p in params if 'kernel_in' in p]
    + [f32(slots, batch, m), f32(slots, batch, n)] * 2
  )
  body = functools.partial(
    _backward_kernel,
    plan=plan,
    zigzag=zigzag,
    body=RowProgram(tiles.batch, tiles.chunk, dtype, interpret),
  )
  d_x, d_h, *rest = call_by_rows(
    body,
    'mogrifier_rounds_backward',
    [d_mixed, x, h, *gates],
    _flat_weights(params, plan),
    outs,
    tiles,
    interpret,
  )
  return d_x, d_h, rest[: len(plan)], rest[len(plan) : len(plan) + sum(plan)]
