"""What the zoo needs to know about any `nn.RNNCellBase`.

Cells follow flax's protocol: `carry, y = cell(carry, x)`,
`cell.initialize_carry(rng, input_shape)` and `cell.num_feature_axes`. Beyond
that, stacks and transforms need the previous output h inside a carry (to drop
it out, or to mogrify it): in flax's cells and ours it is the carry itself
(`GRUCell`, `SimpleCell`) or the carry tuple's last element (`LSTMCell`'s
`(c, h)`).

A cell whose input projection W x does not depend on the carry may also offer
`project_inputs(xs)` (for all time steps at once) and
`step_projected(carry, projected_x)`; stacks then hoist W x out of the scan.
A cell that can run a whole window with a backward pass of its own offers
`scan_window(carry, inputs, state_mask, unroll)`; a wrapper whose fast path
depends on the cell inside it says so in `scans_windows`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn

Carry = Any


def carry_output(carry: Carry):
  """The previous output h held in a cell's carry."""
  return carry[-1] if isinstance(carry, tuple) else carry


def replace_carry_output(carry: Carry, h) -> Carry:
  """The carry with its previous output h replaced."""
  return (*carry[:-1], h) if isinstance(carry, tuple) else h


def supports_hoisting(cell: nn.Module) -> bool:
  """Whether the cell can compute its input projection outside the scan."""
  return hasattr(cell, 'project_inputs') and hasattr(cell, 'step_projected')


def supports_window_scan(cell: nn.Module) -> bool:
  """Whether the cell runs whole windows itself (`scan_window`)."""
  return hasattr(cell, 'scan_window') and getattr(cell, 'scans_windows', True)
