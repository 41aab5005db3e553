"""Unrolling any `nn.RNNCellBase` over time."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.base import carry_output, describe, replace_carry_output
from lm_zoo.cells.held_steps import check_steps, held, own
from lm_zoo.cells.scans import WINDOW_KERNELS, cell_scans, resolve_scan, window_kernel


def _masked(carry, state_mask):
  if state_mask is None:
    return carry
  return replace_carry_output(carry, carry_output(carry) * state_mask)


def _step(cell, carry, xs, state_mask):
  x, valid = xs
  new_carry, y = cell(_masked(carry, state_mask), x)
  return held(valid, new_carry, carry), own(valid, y)


def _step_projected(cell, carry, xs, state_mask):
  projected_x, valid = xs
  new_carry, y = cell_scans(cell).step(cell, _masked(carry, state_mask), projected_x)
  return held(valid, new_carry, carry), own(valid, y)


def check_carry(cell: nn.RNNCellBase, carry, inputs: jax.Array) -> None:
  """Raises ValueError unless the arrays of `carry` (any pytree) have the
  shapes of `cell.initialize_carry` for `inputs` (T, B, m): a carry of
  another batch or width failed deep inside JAX, in a scan or a window
  kernel. Shapes only, traced once with the layer: nothing is allocated."""
  input_shape = inputs.shape[1:]
  expected = jax.eval_shape(lambda: cell.initialize_carry(jax.random.key(0), input_shape))
  want = tuple(x.shape for x in jax.tree.leaves(expected))
  got = tuple(jnp.shape(x) for x in jax.tree.leaves(carry))
  if got != want:
    raise ValueError(
      f"carry: its arrays' shapes {got} do not fit inputs {inputs.shape}: {describe(cell)} "
      f'expects {want}, as cell.initialize_carry(rng, {input_shape}) makes'
    )


class RecurrentLayer(nn.Module):
  """Runs `cell` over time-major inputs (T, B, m) in the way `scan` asks for
  (`lm_zoo.cells.scans.SCANS`; a way the cell cannot take is refused).
  `state_mask`, if given, multiplies the previous output h fed back into the
  cell at every step (variational dropout on the state: one mask per window).
  `steps`, if given, (T,) bool, marks the window's own steps, first: the
  others hold the carry and output zeros (`lm_zoo.cells.held_steps`), so a
  window padded to a shared length gives its own steps' results.

  Attributes:
    cell: any `nn.RNNCellBase`.
    unroll: scan steps unrolled per loop iteration.
    scan: one of `lm_zoo.cells.scans.SCANS`.
  """

  cell: nn.RNNCellBase
  unroll: int = 1
  scan: str = 'auto'

  @nn.compact
  def __call__(
    self,
    carry,
    inputs: jax.Array,
    state_mask: jax.Array | None = None,
    steps: jax.Array | None = None,
  ):
    scan = resolve_scan(self.cell, self.scan, state_mask=state_mask is not None)
    steps = check_steps(steps, inputs.shape[0])
    check_carry(self.cell, carry, inputs)
    if scan in WINDOW_KERNELS:
      if self.is_initializing():
        self.cell(carry, inputs[0])  # creates the cell's parameters
      # A cell whose parameters live in other modules (LSTMRHNStack's layers) has none here.
      params = self.cell.variables.get('params', {})
      return window_kernel(self.cell, scan)(
        self.cell, params, carry, inputs, state_mask, self.unroll, steps
      )
    if scan == 'hoisted':
      step, xs = _step_projected, cell_scans(self.cell).project(self.cell, inputs)
    else:
      step, xs = (nn.remat(_step) if scan == 'remat' else _step), inputs
    scanned = nn.scan(
      step,
      variable_broadcast='params',
      split_rngs={'params': False, 'dropout': False},
      in_axes=(0, nn.broadcast),
      out_axes=0,
      unroll=self.unroll,
    )
    return scanned(self.cell, carry, (xs, steps), state_mask)
