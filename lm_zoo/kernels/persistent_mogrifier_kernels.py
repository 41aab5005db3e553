"""The launches of `persistent_mogrifier`: the persistent kernel over a window
('persistent', 'unfenced', 'no_barrier'), and the kernels of one phase each
that 'per_step' launches, 2r + 1 a step in a `lax.scan`; both run the phases
of `persistent_mogrifier_phases.Block`."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lm_zoo.kernels.grid_barrier import grid_barrier
from lm_zoo.kernels.persistent_lstm import GATES
from lm_zoo.kernels.persistent_mogrifier_phases import (
  WEIGHTS,
  Block,
  Plan,
  Smem,
  from_columns,
  scratch_types,
)

PHASE_ARGS = {'reduce': (1, 2), 'update': (1, 2), 'gates': (2, 4)}  # (inputs, outputs)


def _launch(body, out_type, plan: Plan, interpret: Any):
  return plgpu.kernel(
    body,
    out_type=out_type,
    scratch_types=scratch_types(plan),
    grid=(plan.layout.blocks,),
    grid_names=('blocks',),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    interpret=interpret,
  )


def _first_h(h_first, history, t):
  """A copier of h^0's columns: m ⊙ h_0's at step 0, else the history's of step t-1."""

  def copy(cols, buffer, bar):
    @pl.when(t == 0)
    def _():
      plgpu.copy_gmem_to_smem(h_first.at[:, cols], buffer, bar)

    @pl.when(t > 0)
    def _():
      plgpu.copy_gmem_to_smem(history.at[t - 1, :, cols], buffer, bar)

  return copy


def _last_rounds(rounds: int) -> tuple[int, int]:
  """The rounds that give x^↑ and h^↑ (0: none, h^↑ = h^0)."""
  return (rounds, rounds - 1) if rounds % 2 else (rounds - 1, rounds)


def _window_step(block: Block, t, phase, ins, outs):
  """Step t's 2r + 1 phases, `phase(q, run)` running the q-th."""
  plan, r = block.plan, block.plan.rounds
  x_g, x16_g, _, h16_g, _ = ins
  hs_g, hist_g, acts_g, cs_g, a32_g, a16_g, px_g, gx_g, ph_g, gh_g, _ = outs
  published = lambda i: (px_g if i % 2 else ph_g).at[t, (i - 1) // 2]
  gate_out = lambda i: (gx_g if i % 2 else gh_g).at[t, (i - 1) // 2]
  first_h = _first_h(h16_g, hist_g, t)

  def source(i):
    if plan.zigzag and i > 1:
      return from_columns(published(i - 1))
    return first_h if i % 2 else from_columns(x16_g.at[t])

  block.load_input(x_g.at[t])
  for i in range(1, r + 1):
    a32, a16 = a32_g.at[t, i - 1], a16_g.at[t, i - 1]
    phase(2 * i - 2, functools.partial(block.reduce, i, source(i), a32, a16))
    phase(2 * i - 1, functools.partial(block.update, i, a16, published(i), gate_out(i)))
  last_x, last_h = _last_rounds(r)
  copy_h = from_columns(published(last_h)) if last_h else first_h
  run = functools.partial(
    block.gates, from_columns(published(last_x)), copy_h, hs_g.at[t], hist_g.at[t]
  )
  phase(2 * r, functools.partial(run, acts_g.at[t], cs_g.at[t]))


def _persistent_body(*refs, plan: Plan, steps: int, mode: str):
  ins, weights, outs, scratch = _split(refs, 5, len(WEIGHTS), 11)
  _, _, h_g, _, c0_g = ins
  block = Block(plan, Smem(*scratch), jax.lax.axis_index('blocks'))
  block.load_weights(dict(zip(WEIGHTS, weights)))
  block.copy_state({'c': c0_g, 'h': h_g}, into_smem=True)
  sync = grid_barrier(mode, plan.layout.blocks)
  crossings = 2 * plan.rounds + 1

  @pl.loop(0, steps)
  def _step(t):
    def phase(q, run):
      """Crossing t (2r + 1) + q: every block's writes before, its own after."""
      if sync is not None:
        done = t * crossings + q

        @pl.when(done > 0)
        def _():
          sync.wait(done)

      run()
      if sync is not None:
        sync.arrive()

    _window_step(block, t, phase, ins, outs)

  plgpu.copy_smem_to_gmem(block.s.c, outs[-1].at[:, block.units])
  plgpu.wait_smem_to_gmem(0)


def persistent_kernel(plan: Plan, steps: int, mode: str, interpret: Any):
  """(x (T, 64, m_pad) float32 and bfloat16, m ⊙ h_0 (64, n_pad) float32
  and bfloat16, c_0, the weights) -> (hs, history, activations (T, G, 4, 64,
  u), cs, a (T, r, 64, k_pad) float32 and bfloat16, the odd rounds'
  published x^i and g_i (T, ⌈r/2⌉, 64, m_pad), the even rounds' h^i and g_i
  (T, ⌊r/2⌋ or 1, 64, n_pad), c_T)."""
  rows, n, m, k, u = plan.layout.rows, plan.layout.units, plan.inputs, plan.rank, plan.u
  f32, bf16 = jnp.float32, jnp.bfloat16
  s = lambda *shape, dtype=f32: jax.ShapeDtypeStruct(shape, dtype)
  out_type = (
    s(steps, rows, n),
    s(steps, rows, n, dtype=bf16),
    s(steps, plan.layout.blocks, GATES, rows, u),
    s(steps, rows, n),
    s(steps, plan.rounds, rows, k),
    s(steps, plan.rounds, rows, k, dtype=bf16),
    s(steps, plan.x_rounds, rows, m, dtype=bf16),
    s(steps, plan.x_rounds, rows, m),
    s(steps, plan.h_rounds, rows, n, dtype=bf16),
    s(steps, plan.h_rounds, rows, n),
    s(rows, n),
  )
  body = functools.partial(_persistent_body, plan=plan, steps=steps, mode=mode)
  return _launch(body, out_type, plan, interpret)


def _phase_reads(phase: str, i: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """The weights and the state (`Smem` names) a phase's launch copies in;
  it copies the state back out."""
  if phase == 'reduce':
    return ('a',), ()
  if phase == 'update':
    return (('bx', 'bias_x'), ('x',)) if i % 2 else (('bh', 'bias_h'), ('h',))
  return ('wu', 'bias_g', 'm'), ('c', 'h')


def _split(refs, *sizes):
  """`refs` cut into consecutive groups of `sizes`, and the rest."""
  groups = []
  for size in sizes:
    groups.append(refs[:size])
    refs = refs[size:]
  return (*groups, refs)


def _phase_body(*refs, plan: Plan, phase: str, i: int):
  (ins, outs), (weights, state) = PHASE_ARGS[phase], _phase_reads(phase, i)
  sizes = (len(state), len(weights), ins, len(state), outs)
  state_in, weights_in, args, state_out, results, scratch = _split(refs, *sizes)
  block = Block(plan, Smem(*scratch), jax.lax.axis_index('blocks'))
  block.load_weights(dict(zip(weights, weights_in)))
  block.copy_state(dict(zip(state, state_in)), into_smem=True)
  if phase == 'reduce':
    block.reduce(i, from_columns(args[0]), *results)
  elif phase == 'update':
    block.update(i, args[0], *results)
  else:
    block.gates(from_columns(args[0]), from_columns(args[1]), *results)
  block.copy_state(dict(zip(state, state_out)), into_smem=False)


def _phase_kernel(plan: Plan, phase: str, i: int, interpret: Any):
  """One phase of one step: (its state (`_phase_reads`: c, x^i, h^i (64,
  width) float32), its weights, its inputs) -> (the state, its outputs): a
  reduce (source) -> (a_i float32, bfloat16), an update (a_i) ->
  (published, g_i), the gates (x^↑, h^↑) -> (h_t, m ⊙ h_t, activations, c_t)."""
  rows, n, m, k = plan.layout.rows, plan.layout.units, plan.inputs, plan.rank
  f32, bf16 = jnp.float32, jnp.bfloat16
  s = lambda *shape, dtype=f32: jax.ShapeDtypeStruct(shape, dtype)
  width = m if i % 2 else n
  results = {
    'reduce': (s(rows, k), s(rows, k, dtype=bf16)),
    'update': (s(rows, width, dtype=bf16), s(rows, width)),
    'gates': (
      s(rows, n),
      s(rows, n, dtype=bf16),
      s(plan.layout.blocks, GATES, rows, plan.u),
      s(rows, n),
    ),
  }[phase]
  state = [s(rows, m if name == 'x' else n) for name in _phase_reads(phase, i)[1]]
  body = functools.partial(_phase_body, plan=plan, phase=phase, i=i)
  return _launch(body, (*state, *results), plan, interpret)


def run_per_phase(plan: Plan, interpret: Any, x, x16, h, h16, c, *weights):
  """The window a phase a launch (mode 'per_step'): `persistent_kernel`'s
  arguments; returns (hs, history, activations, cs, c_T, a (T, r, 64,
  k_pad), per round its published values and g_i (T, 64, width))."""
  r, weights = plan.rounds, dict(zip(WEIGHTS, weights))

  def launch(phase, i, state, *args):
    names, state_names = _phase_reads(phase, i)
    kernel = _phase_kernel(plan, phase, i, interpret)
    outs = kernel(*(state[k] for k in state_names), *(weights[k] for k in names), *args)
    state.update(zip(state_names, outs))
    return outs[len(state_names) :]

  def step(carry, xs):
    c, h, h16 = carry
    x_t, x16_t = xs
    state, published, gates, a32s = {'c': c, 'x': x_t, 'h': h}, [], [], []
    for i in range(1, r + 1):
      source = published[-1] if plan.zigzag and i > 1 else (h16 if i % 2 else x16_t)
      a32, a16 = launch('reduce', i, state, source)
      pub, gate = launch('update', i, state, a16)
      a32s.append(a32)
      published.append(pub)
      gates.append(gate)
    last_x, last_h = _last_rounds(r)
    h_up = published[last_h - 1] if last_h else h16
    hs, hist, acts, cs = launch('gates', 0, state, published[last_x - 1], h_up)
    return (state['c'], state['h'], hist), (hs, hist, acts, cs, jnp.stack(a32s), published, gates)

  (c, _, _), outs = jax.lax.scan(step, (c, h, h16), (x, x16))
  hs, hist, acts, cs, a32, published, gates = outs
  return hs, hist, acts, cs, c, a32, published, gates
