"""Unrolling any `nn.RNNCellBase` over time, and stacks of such layers."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.base import carry_output, replace_carry_output
from lm_zoo.cells.scans import WINDOW_KERNELS, cell_scans, resolve_scan, window_kernel
from lm_zoo.errors import ConfigError


def _masked(carry, state_mask):
  if state_mask is None:
    return carry
  return replace_carry_output(carry, carry_output(carry) * state_mask)


def _step(cell, carry, x, state_mask):
  return cell(_masked(carry, state_mask), x)


def _step_projected(cell, carry, projected_x, state_mask):
  return cell_scans(cell).step(cell, _masked(carry, state_mask), projected_x)


class RecurrentLayer(nn.Module):
  """Runs `cell` over time-major inputs (T, B, m) in the way `scan` asks for
  (`lm_zoo.cells.scans.SCANS`; a way the cell cannot take is refused).
  `state_mask`, if given, multiplies the previous output h fed back into the
  cell at every step (variational dropout on the state: one mask per window).

  Attributes:
    cell: any `nn.RNNCellBase`.
    unroll: scan steps unrolled per loop iteration.
    scan: one of `lm_zoo.cells.scans.SCANS`.
  """

  cell: nn.RNNCellBase
  unroll: int = 1
  scan: str = 'auto'

  @nn.compact
  def __call__(self, carry, inputs: jax.Array, state_mask: jax.Array | None = None):
    scan = resolve_scan(self.cell, self.scan, state_mask=state_mask is not None)
    if scan in WINDOW_KERNELS:
      if self.is_initializing():
        self.cell(carry, inputs[0])  # creates the cell's parameters
      # A cell whose parameters live in other modules (LSTMRHNStack's layers) has none here.
      params = self.cell.variables.get('params', {})
      return window_kernel(self.cell, scan)(self.cell, params, carry, inputs, state_mask,
                                            self.unroll)
    if scan == 'hoisted':
      step, xs = _step_projected, cell_scans(self.cell).project(self.cell, inputs)
    else:
      step, xs = (nn.remat(_step) if scan == 'remat' else _step), inputs
    scanned = nn.scan(step, variable_broadcast='params',
                      split_rngs={'params': False, 'dropout': False},
                      in_axes=(0, nn.broadcast), out_axes=0, unroll=self.unroll)
    return scanned(self.cell, carry, xs, state_mask)


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
    scan: how each layer runs a window (`RecurrentLayer`).
    skip_connections: return the sum of the layers' outputs.
  """

  cells: Sequence[nn.RNNCellBase]
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  variational_dropout: bool = True
  unroll: int = 1
  scan: str = 'auto'
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
      carry, x = RecurrentLayer(cell, unroll=self.unroll, scan=self.scan,
                                name=f'layer_{layer}')(carry, x, state_mask)
      new_carries.append(carry)
      if self.skip_connections:
        if total is not None and x.shape != total.shape:
          raise ConfigError(f'skip connections sum the layers\' outputs, but layer {layer} '
                            f'has {x.shape[-1]} units and the layers below '
                            f'{total.shape[-1]}: give every layer one size')
        total = x if total is None else total + x
    return new_carries, x if total is None else total
