"""What the zoo needs to know about any `nn.RNNCellBase`.

Cells follow flax's protocol: `carry, y = cell(carry, x)`,
`cell.initialize_carry(rng, input_shape)` and `cell.num_feature_axes`. Beyond
that, stacks and transforms need the previous output h inside a carry (to drop
it out, or to mogrify it): in flax's cells and ours it is the carry itself
(`GRUCell`, `SimpleCell`) or the carry tuple's last element (`LSTMCell`'s
`(c, h)`).

A cell may also declare, for the regularisers:

- `dropout_rates`, a class attribute: the names of its fields that are
  dropout rates (`ALSTMCell`'s `dropout_latent`), which MC dropout's rate
  multiplier scales (`dropout_scaled`);
- `hidden_to_hidden(of)`, an `nn.nowrap` method: the '/'-joined paths, under
  the cell's own parameters, of its hidden-to-hidden matrices, which weight
  drop masks; `of(inner)` gives those of a cell it wraps
  (`lm_zoo.models.regularisation.hidden_to_hidden`, where flax's cells are
  declared for them).

How a cell type runs whole windows faster than step by step (hoisting W x,
a fused kernel) is registered in `lm_zoo.cells.scans`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn

Carry = Any


def carry_output(carry: Carry):
  """The previous output h held in a cell's carry."""
  return carry[-1] if isinstance(carry, tuple) else carry


def replace_carry_output(carry: Carry, h) -> Carry:
  """The carry with its previous output h replaced."""
  return (*carry[:-1], h) if isinstance(carry, tuple) else h


def describe(cell: nn.Module) -> str:
  """The cell's class, with the cells it wraps: 'Mogrify(GRUCell)'."""
  inner = [
    describe(getattr(cell, f.name))
    for f in dataclasses.fields(cell)
    if f.name != 'parent' and isinstance(getattr(cell, f.name), nn.Module)
  ]
  return type(cell).__name__ + (f'({", ".join(inner)})' if inner else '')


def _scaled(value: Any, factor: float) -> Any:
  if isinstance(value, tuple):
    scaled = tuple(_scaled(v, factor) for v in value)
    return value if all(a is b for a, b in zip(scaled, value)) else scaled
  if isinstance(value, nn.Module):
    return dropout_scaled(value, factor)
  return value


def dropout_scaled(obj: nn.Module, factor: float) -> nn.Module:
  """A copy of the unbound module `obj` (a cell, a model or one of its
  parts) with each rate its class names in `dropout_rates` multiplied by
  `factor`, and so every module among its fields (a wrapped cell, a model's
  parts, a stack's cells): MC dropout's rate multiplier.

  Raises:
    ValueError: a scaled rate leaves [0, 1), naming it.
  """
  rates = {name: getattr(obj, name) * factor for name in getattr(type(obj), 'dropout_rates', ())}
  outside = {
    f'{type(obj).__name__}.{name}': rate for name, rate in rates.items() if not 0 <= rate < 1
  }
  if outside:
    raise ValueError(f'dropout scaled by {factor} leaves rates outside [0, 1): {outside}')
  changes = dict(rates)
  for field in dataclasses.fields(obj):
    if field.name not in ('parent', 'name') and field.init:
      value = getattr(obj, field.name)
      scaled = _scaled(value, factor)
      if scaled is not value:
        changes[field.name] = scaled
  if not changes:
    return obj
  return obj.clone(**changes)
