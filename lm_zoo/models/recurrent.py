"""Unrolling any `nn.RNNCellBase` over time, and stacks of such layers."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.base import (carry_output, replace_carry_output, supports_hoisting,
                               supports_window_scan)
from lm_zoo.errors import ConfigError


def _step(cell, carry, x, state_mask):
  if state_mask is not None:
    carry = replace_carry_output(carry, carry_output(carry) * state_mask)
  return cell(carry, x)


def _step_projected(cell, carry, projected_x, state_mask):
  if state_mask is not None:
    carry = replace_carry_output(carry, carry_output(carry) * state_mask)
  return cell.step_projected(carry, projected_x)


class RecurrentLayer(nn.Module):
  """Runs `cell` over time-major inputs (T, B, m) with `lax.scan`.

  When the cell offers `project_inputs` / `step_projected`, W x for all steps
  is one matrix product before the scan and only the recurrent part is scanned.
  When it runs whole windows with its own backward pass (`scan_window`, as
  `LSTMCell` and `Mogrify(LSTMCell(...))` do) and `fused` is on, that runs
  the window. With
  `remat` each step is recomputed in the backward pass from its input and
  carry, the only per-step values kept: the memory for long windows, at the
  cost of a second forward pass (W x stays inside the scan then).
  `state_mask`, if given, multiplies the previous output h fed back into the
  cell at every step (variational dropout on the state: one mask per window).

  Attributes:
    cell: any `nn.RNNCellBase`.
    unroll: scan steps unrolled per loop iteration.
    fused: use the cell's `scan_window` when it has one.
    remat: keep only each step's input and carry for the backward pass.
  """

  cell: nn.RNNCellBase
  unroll: int = 1
  fused: bool = True
  remat: bool = False

  @nn.compact
  def __call__(self, carry, inputs: jax.Array, state_mask: jax.Array | None = None):
    if self.remat:
      step, xs = nn.remat(_step), inputs
    elif self.fused and supports_window_scan(self.cell):
      return self.cell.scan_window(carry, inputs, state_mask, self.unroll)
    elif supports_hoisting(self.cell):
      step, xs = _step_projected, self.cell.project_inputs(inputs)
    else:
      step, xs = _step, inputs
    scan = nn.scan(step, variable_broadcast='params',
                   split_rngs={'params': False, 'dropout': False},
                   in_axes=(0, nn.broadcast), out_axes=0, unroll=self.unroll)
    return scan(self.cell, carry, xs, state_mask)


class RecurrentStack(nn.Module):
  """Layers of cells with variational (time-shared) dropout between them.

  `dropout_hidden` drops each layer's output that feeds the next layer,
  `dropout_state` the h each layer feeds back to itself, with masks drawn once
  per call and shared over time (Gal & Ghahramani 2016); with
  `variational_dropout=False` the between-layer mask is new at every step
  (the state's stays one per call, as lamb's `shared_mask_dropout=False`).
  The stack returns the last layer's output undropped or, with
  `skip_connections`, the sum of every layer's undropped output
  (lamb's `skip_multi_rnn_cell.py`; all layers must then be of one size).

  Attributes:
    cells: one `nn.RNNCellBase` per layer.
    dropout_hidden: rate between layers.
    dropout_state: rate on the recurrent h.
    variational_dropout: share the between-layer mask over time.
    unroll: scan unroll.
    fused: run each window with the cell's `scan_window` when it has one.
    remat: recompute each step in the backward pass (`RecurrentLayer`).
    skip_connections: return the sum of the layers' outputs.
  """

  cells: Sequence[nn.RNNCellBase]
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  variational_dropout: bool = True
  unroll: int = 1
  fused: bool = True
  remat: bool = False
  skip_connections: bool = False

  @nn.compact
  def __call__(self, carries: Sequence[Any], inputs: jax.Array, *, train: bool):
    """inputs (T, B, m) time-major; returns (new carries, outputs (T, B, n))."""
    new_carries, x, total = [], inputs, None
    for layer, (cell, carry) in enumerate(zip(self.cells, carries)):
      if layer > 0:
        x = nn.Dropout(self.dropout_hidden,
                       broadcast_dims=(0,) if self.variational_dropout else (),
                       deterministic=not train)(x)
      state_mask = None
      if train and self.dropout_state > 0:
        h = carry_output(carry)
        state_mask = nn.Dropout(self.dropout_state, deterministic=False)(
            jnp.ones(h.shape, h.dtype))
      carry, x = RecurrentLayer(cell, unroll=self.unroll, fused=self.fused,
                                remat=self.remat, name=f'layer_{layer}')(
          carry, x, state_mask)
      new_carries.append(carry)
      if self.skip_connections:
        if total is not None and x.shape != total.shape:
          raise ConfigError(f'skip connections sum the layers\' outputs, but layer {layer} '
                            f'has {x.shape[-1]} units and the layers below '
                            f'{total.shape[-1]}: give every layer one size')
        total = x if total is None else total + x
    return new_carries, x if total is None else total
