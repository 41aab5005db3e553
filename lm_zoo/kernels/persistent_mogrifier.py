"""The forward pass over a window of an LSTM layer wrapped in the Mogrifier's
low-rank rounds as ONE persistent Mosaic GPU kernel (Hopper: TMA copies,
wgmma): what `mixed_lstm_forward(..., MogrifierRounds(r, zigzag, bfloat16),
..., dtype=bfloat16)` returns.

A step, with x^{-1} = x_t and h^0 = m ⊙ h_{t-1} (m a mask on the fed-back
state), runs for i = 1..r

    odd i:  x^i = 2σ(z_i) ⊙ x^{i-2},  z_i = bf16(h^{i-1}) A_i B_i + b_i
    even i: h^i = 2σ(z_i) ⊙ h^{i-2},  z_i = bf16(x^{i-1}) A_i B_i + b_i

(`zigzag=False`: the sources are always h^0 and x_t), with a_i =
bf16(source) A_i (the low-rank hidden, k wide) summed in float32 and z_i =
bf16(a_i) B_i in float32 + b_i; then the LSTM on the last rounds' values:

    [i, f, j, o] = bf16([x^↑, h^↑]) bf16([W; U]) + b
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j),   h_t = σ(o) ⊙ tanh(c_t)

(σ(i) capped at 1 - σ(f) with `cap_input_gate`). The chain x^i, h^i, c and
h_t stay float32; every product's operands are bfloat16.

The grid has G blocks, as `persistent_lstm`'s (one per 8 hidden units, n
padded to a multiple of 32): block g owns u hidden units (the 4u columns of
[W; U], copied to shared memory once) and v = m_pad / G input features. A
round's a_i needs the whole source, so a round is two phases, each ended by
a crossing of the grid's barrier (`grid_barrier`):

1. reduce: a_i's k_pad columns are J = k_pad / 8 groups of 8; the pair
   p = (i - 1) J + j goes to block p mod G, slot p // G (A_i[:, 8j:8j+8] in
   shared memory, loaded once). The block streams the published source
   (64 rows, bfloat16) through two chunk buffers (the copy of chunk k+1 in
   flight while wgmma multiplies chunk k, as `persistent_lstm_backward`'s
   product) and writes its 8 columns of a_i (float32 for the residuals,
   bfloat16 for the update) to a buffer of the step's own.
2. update: every block reads a_i whole, multiplies it by B_i[:, its slice]
   (loaded once), adds b_i's slice, and gates its slice of x or h (float32,
   in shared memory); it publishes the new slice in bfloat16 (what the next
   round reduces, and [x^↑, h^↑]) and g_i = 2σ(z_i) in float32.

The gates' phase streams [x^↑ | h^↑] against the block's [W; U] slice, adds
b, updates c (in shared memory), and writes h_t, the bfloat16 history
m ⊙ h_t (the next step's h^0), the activations and c_t. A step crosses the
barrier 2r + 1 times (the count runs over the window: crossing q waits for
q G arrivals). Every buffer a block reads that others write has a slot per
step (and round), so no block overwrites what another may still read. A
block holding two pairs of one round (J > G: small grids) streams the
source once for each.

Tiles: batch padded to 64 rows (wgmma's M), operands swizzled by 64 bytes
(32 bfloat16 columns): m_pad, n_pad and k_pad multiples of 32. The B
operands 8 columns wide (A's pairs, B_i's slices) are stored K-major and
read transposed. At the 24M recipe (m = n = 912, k = 84, r = 5, batch 64):
G = 116 blocks of u = v = 8, m_pad = n_pad = 928, k_pad = 96, J = 12 (60
pairs: one slot), chunks of 32 columns (928 = 29 x 32); shared memory per
block [W; U] 1856 x 32 x 2 = 116 KiB, A's pair 14.5 KiB, a_i 12 KiB, B_i's
slices 7.5 KiB, the buffers 8 KiB, biases, state and output tiles 47 KiB
(each buffer rounded up to 1 KiB, Pallas' alignment): 209,944 bytes of the
227 KiB (`Plan.smem_bytes`, Mosaic GPU's own count; larger sizes are
refused).
The streamed products loop over their chunks (unrolled, Mosaic GPU's layout
inference took 15 s to lower the recipe's kernel; looped, 1.5 s), so [W; U]
and A's pairs are laid out a chunk of rows after another.

Modes (`grid_barrier.MODES`): 'persistent' is the one launch above (with
one block it needs no barrier), 'unfenced' the same without the barrier's
proxy fences and 'no_barrier' one launch without the barrier (timing only:
both may read stale values with G > 1). 'per_step' here launches ONE PHASE
at a time (2r + 1 launches a step, each phase's body the persistent
kernel's, its state passed between launches through global arrays): a
launch boundary is the barrier, so it runs in Pallas' GPU interpreter
(which has no semaphores) with several blocks.

Example::

  hs, (c_T, h_T), (acts, cs, mixed, residuals) = persistent_mogrifier_forward(
    inputs, rounds, W, b, U, h0, c0, state_mask=mask
  )
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from lm_zoo.kernels.grid_barrier import check_blocks_run, check_mode, one_model_a_launch
from lm_zoo.kernels.persistent_lstm import GATES, by_blocks, grid_for, padded, unblocked_gates
from lm_zoo.kernels.persistent_mogrifier_kernels import persistent_kernel, run_per_phase
from lm_zoo.kernels.persistent_mogrifier_phases import PAIR, Plan, plan_for

__all__ = ['persistent_mogrifier_forward']


def _check_args(inputs, rounds, input_kernel, bias, recurrent_kernel, h0, c0, state_mask):
  if inputs.ndim != 3 or inputs.shape[0] < 1:
    raise ValueError(f'inputs must be (T >= 1, B, m), got {inputs.shape}')
  _, batch, m = inputs.shape
  n = recurrent_kernel.shape[0]
  wanted = {
    'input_kernel': (input_kernel, (m, GATES * n)),
    'bias': (bias, (GATES * n,)),
    'recurrent_kernel': (recurrent_kernel, (n, GATES * n)),
    'h0': (h0, (batch, n)),
    'c0': (c0, (batch, n)),
    'state_mask': (state_mask, (batch, n)),
  }
  for name, (array, shape) in wanted.items():
    if array is not None and array.shape != shape:
      raise ValueError(f'{name} must be {shape} (inputs {inputs.shape}, n={n}), got {array.shape}')
  if not rounds:
    raise ValueError('rounds must hold at least one round (r >= 1)')
  for i, params in enumerate(rounds, start=1):
    if 'kernel_in' not in params:
      raise ValueError(
        f'rounds[{i - 1}] is full rank ({sorted(params)}): this kernel runs low-rank rounds '
        "only ('kernel_in', 'kernel_out'); use mixed_lstm_forward for full rank"
      )
    source, target = (n, m) if i % 2 else (m, n)
    k = params['kernel_in'].shape[-1]
    if params['kernel_in'].shape != (source, k) or params['kernel_out'].shape != (k, target):
      raise ValueError(
        f'rounds[{i - 1}] must have kernel_in ({source}, k) and kernel_out (k, {target}), got '
        f'{params["kernel_in"].shape} and {params["kernel_out"].shape}'
      )


def _rows(a, *sizes):
  """`a` zero-padded at the end of its leading axes to `sizes`."""
  pads = [(0, s - have) for s, have in zip(sizes, a.shape)]
  return jnp.pad(a, pads + [(0, 0)] * (a.ndim - len(sizes)))


def _targets(plan: Plan, rounds, first: int, width: int):
  """B_i's and b_i's slices by blocks for rounds first, first + 2, ...: (G,
  count, k_pad, w) (compiled: (G, count, w, k_pad)) and (G, count, 64, w)."""
  blocks, w, k = plan.layout.blocks, width // plan.layout.blocks, plan.rank
  bs, biases = [], []
  for params in rounds[first - 1 :: 2]:
    bs.append(_rows(params['kernel_out'], k, width).reshape(k, blocks, w).swapaxes(0, 1))
    bias = params.get('bias', jnp.zeros(params['kernel_out'].shape[1]))
    biases.append(jnp.broadcast_to(_rows(bias, width).reshape(blocks, 1, w), (blocks, 64, w)))
  if not bs:  # r = 1: no even round; one unused slot
    bs, biases = [jnp.zeros((blocks, k, w))], [jnp.zeros((blocks, 64, w))]
  b = jnp.stack(bs, 1).astype(jnp.bfloat16)
  return b.swapaxes(-1, -2) if plan.transposed else b, jnp.stack(biases, 1).astype(jnp.float32)


def _weights(plan: Plan, rounds, input_kernel, bias, recurrent_kernel, mask):
  """The weights re-laid out by blocks: [W; U]'s columns (G, chunks,
  chunk, 4u), A's pairs (G, slots, chunks, chunk, 8) (compiled: (..., 8,
  chunk)), B's slices (odd, even), the biases, and the mask (64, n_pad)."""
  layout, rows, n = plan.layout, plan.layout.rows, recurrent_kernel.shape[0]
  kernel = jnp.concatenate(
    [_rows(input_kernel, plan.inputs), _rows(recurrent_kernel, layout.units)]
  ).astype(jnp.bfloat16)
  wu = by_blocks(kernel, layout, (kernel.shape[0],))
  wu = wu.reshape(layout.blocks, -1, plan.chunk, wu.shape[-1])  # chunks of rows
  bias_g = by_blocks(jnp.broadcast_to(bias.astype(jnp.float32), (rows, GATES * n)), layout, (rows,))
  a = jnp.stack([_rows(p['kernel_in'], plan.widest, plan.rank) for p in rounds])
  pairs = a.reshape(len(rounds), plan.widest, plan.groups, PAIR).swapaxes(1, 2)
  pairs = _rows(pairs.reshape(-1, plan.widest, PAIR), plan.slots * layout.blocks)
  pairs = pairs.reshape(plan.slots, layout.blocks, -1, plan.chunk, PAIR).swapaxes(0, 1)
  pairs = (pairs.swapaxes(-1, -2) if plan.transposed else pairs).astype(jnp.bfloat16)
  bx, bias_x = _targets(plan, rounds, 1, plan.inputs)
  bh, bias_h = _targets(plan, rounds, 2, layout.units)
  return wu, pairs, bx, bh, bias_x, bias_h, bias_g, padded(mask, layout, jnp.float32)


def _run(plan: Plan, mode: str, interpret, arrays):
  """The launch(es) of `mode`: (hs, history, acts, cs, c_T, a (T, r, 64,
  k_pad), per round its published values and g_i (T, 64, width)); vmapped,
  a model at a time (`one_model_a_launch`)."""

  def launches(*arrays):
    if mode == 'per_step':
      return run_per_phase(plan, interpret, *arrays)
    kernel = persistent_kernel(plan, arrays[0].shape[0], mode, interpret)
    hs, hist, acts, cs, a32, _, px, gx, ph, gh, c = kernel(*arrays)
    indices = range(plan.rounds)
    published = [(px if k % 2 == 0 else ph)[:, k // 2] for k in indices]
    gates = [(gx if k % 2 == 0 else gh)[:, k // 2] for k in indices]
    return hs, hist, acts, cs, c, a32, published, gates

  return one_model_a_launch(launches)(*arrays)


def _outputs(plan: Plan, sizes, ranks, h_first, outs):
  """`mixed_lstm_forward`'s outputs, unpadded, from `_run`'s."""
  batch, m, n = sizes
  hs, hist, acts, cs, c, a32, published, gates = outs
  r = plan.rounds
  last_x = published[r - 1 if r % 2 else r - 2]
  last_h = published[r - 2 if r % 2 else r - 1] if r > 1 else jnp.concatenate([h_first, hist[:-1]])
  mixed = jnp.concatenate([last_x[:, :batch, :m], last_h[:, :batch, :n]], -1)
  widths = [m if i % 2 else n for i in range(1, r + 1)]
  kept = [g[:, :batch, :w] for g, w in zip(gates, widths)]
  kept += [a32[:, i, :batch, :k] for i, k in enumerate(ranks)]
  hs = hs[:, :batch, :n]
  per_step = (unblocked_gates(acts, batch, n), cs[:, :batch, :n], mixed, jnp.concatenate(kept, -1))
  return hs, (c[:batch, :n], hs[-1]), per_step


def persistent_mogrifier_forward(
  inputs: jax.Array,
  rounds: Sequence[dict],
  input_kernel: jax.Array,
  bias: jax.Array,
  recurrent_kernel: jax.Array,
  h0: jax.Array,
  c0: jax.Array,
  *,
  state_mask: jax.Array | None = None,
  cap_input_gate: bool = False,
  zigzag: bool = True,
  blocks: int | None = None,
  mode: str = 'persistent',
  interpret: Any = None,
):
  """The Mogrifier LSTM layer's forward pass over a window in one persistent kernel.

  Args:
    inputs: x_1..x_T, (T, B, m).
    rounds: r >= 1 low-rank rounds' parameters, round i = 1..r: {'kernel_in':
      (source width, k), 'kernel_out': (k, target width), optional 'bias':
      (target width,)}; odd i: source h (n), target x (m); even i the reverse.
    input_kernel, bias, recurrent_kernel: W (m, 4n), b (4n,), U (n, 4n);
      gate order i, f, j, o.
    h0, c0: the carry, each (B, n); B at most 64.
    state_mask: m, (B, n): h^0 = m ⊙ h_{t-1}; None keeps h.
    cap_input_gate: write with min(1 - σ(f), σ(i)) in place of σ(i).
    zigzag: False: every round's source is h^0 or x_t.
    blocks, interpret: as `persistent_lstm_forward`'s.
    mode: 'persistent', 'per_step' (a launch a phase), or 'unfenced' and
      'no_barrier' (timing only: they may read stale values with G > 1).

  Returns:
    (h_1..h_T (T, B, n), (c_T, h_T), (activations [σ(i)|σ(f)|tanh(j)|σ(o)]
    (T, B, 4n), c_1..c_T (T, B, n), [x^↑, h^↑] (T, B, m + n) bfloat16, the
    rounds' residuals (T, B, Σ widths + Σ ranks): g_1..g_r, a_1..a_r)), as
    `mixed_lstm_forward` with `MogrifierRounds(r, zigzag, jnp.bfloat16)`.
  """
  check_mode(mode)
  _check_args(inputs, rounds, input_kernel, bias, recurrent_kernel, h0, c0, state_mask)
  steps, batch, m = inputs.shape
  n = recurrent_kernel.shape[0]
  ranks = [p['kernel_in'].shape[-1] for p in rounds]
  settings = dict(zigzag=zigzag, cap_input_gate=cap_input_gate, transposed=interpret is None)
  plan = plan_for(grid_for(batch, n, blocks), m, max(ranks), len(rounds), **settings)
  check_blocks_run(plan.layout.blocks, mode, interpret)
  mask = jnp.ones_like(h0) if state_mask is None else state_mask
  weights = _weights(plan, rounds, input_kernel, bias, recurrent_kernel, mask)
  x = _rows(inputs.astype(jnp.float32), steps, plan.layout.rows, plan.inputs)
  h = padded(h0, plan.layout, jnp.float32) * weights[-1]  # h^0 of step 1, float32
  c = padded(c0, plan.layout, jnp.float32)
  arrays = (x, x.astype(jnp.bfloat16), h, h.astype(jnp.bfloat16), c, *weights)
  outs = _run(plan, mode, interpret, arrays)
  return _outputs(plan, (batch, m, n), ranks, h.astype(jnp.bfloat16)[None], outs)
