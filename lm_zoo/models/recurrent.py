"""Unrolling any `nn.RNNCellBase` over time."""

from __future__ import annotations

import contextlib
import math

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


def on_one_batch_axis(window, carry, inputs: jax.Array, state_mask: jax.Array | None):
  """`window(carry, inputs, state_mask)`, a window kernel over (T, B, m), of
  inputs with any batch axes, (T, ..., m) (none, or several), as the plain
  scan takes them: the batch axes flattened to one and restored."""
  batch = inputs.shape[1:-1]
  if len(batch) == 1:
    return window(carry, inputs, state_mask)
  rows = math.prod(batch)
  flat = lambda a: a.reshape(rows, *a.shape[len(batch) :])
  if state_mask is not None:
    state_mask = flat(jnp.broadcast_to(state_mask, jnp.shape(carry_output(carry))))
  inputs = inputs.reshape(inputs.shape[0], rows, inputs.shape[-1])
  carry, ys = window(jax.tree.map(flat, carry), inputs, state_mask)
  restore = lambda a: a.reshape(*batch, *a.shape[1:])
  return jax.tree.map(restore, carry), ys.reshape(ys.shape[0], *batch, *ys.shape[2:])


# JAX's TypeError for jax.jvp (or jax.jacfwd) through a jax.custom_vjp.
_JVP_OF_CUSTOM_VJP = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"


@contextlib.contextmanager
def _reverse_mode_only(cell: nn.RNNCellBase, scan: str):
  """JAX's refusal of forward-mode autodiff through `cell`'s `scan` window
  kernel (a custom VJP) run in the block, as one line naming the scans
  that jvp runs through."""
  try:
    yield
  except TypeError as err:
    if _JVP_OF_CUSTOM_VJP not in str(err):
      raise
    plain = "scan='scan' or 'hoisted'" if cell_scans(cell).project else "scan='scan'"
    raise TypeError(
      f'the {scan!r} window of {describe(cell)} differentiates in reverse mode only '
      f'(jax.grad, jax.vjp): for jax.jvp or jax.jacfwd, give the layer {plain}, '
      'with float32 products'
    ) from None


class RecurrentLayer(nn.Module):
  """Runs `cell` over time-major inputs (T, B, m) in the way `scan` asks for
  (`lm_zoo.cells.scans.SCANS`; a way the cell cannot take is refused); any
  other batch axes, (T, ..., m), none or several, as flax's `nn.RNN` takes.
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
      kernel = window_kernel(self.cell, scan)
      window = lambda c, x, m: kernel(self.cell, params, c, x, m, self.unroll, steps)
      with _reverse_mode_only(self.cell, scan):
        return on_one_batch_axis(window, carry, inputs, state_mask)
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
