"""The recurrent part of `RecurrentLM`: cells one after another (`Stack`), or
aLSTM cells stepped together (`LSTMRHN`).

Both are modules whose `cells` are templates: each layer runs its own copy,
the stack's child `cell_{i}`, so a template given twice (`[cell] * 2`) makes
two layers with parameters of their own. The stack's parameters are those of
its layers' cells, at `cell_{i}/...`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells import LSTMRHNStack, carry_output
from lm_zoo.errors import ConfigError
from lm_zoo.models.recurrent import RecurrentLayer
from lm_zoo.models.regularisation import drop_recurrent_weights, hidden_to_hidden

# The rates of both stacks, scaled by MC dropout (`lm_zoo.cells.dropout_scaled`).
STACK_DROPOUT_RATES = ('dropout_hidden', 'dropout_state', 'dropout_output', 'weight_drop')


def _own_cells(cells) -> list[nn.RNNCellBase]:
  """Each layer's copy of its template cell, the calling stack's child
  `cell_{i}` (deep: a wrapped cell is copied too, so templates that share
  one do not share its parameters)."""
  return [cell.copy(name=f'cell_{i}') for i, cell in enumerate(cells)]


def _dropped_output(
  h: jax.Array, rate: float, variational: bool, train: bool, sow: Any
) -> jax.Array:
  """Dropout on the stack's output (T, B, n), one mask per window when
  `variational`; `sow` (the stack's) keeps the undropped and dropped output
  in 'intermediates' as `output` and `dropped_output`, for AR and TAR."""
  sow('intermediates', 'output', h)
  h = nn.Dropout(
    rate, broadcast_dims=(0,) if variational else (), deterministic=not train, name='output_dropout'
  )(h)
  sow('intermediates', 'dropped_output', h)
  return h


class _Layers(nn.Module):
  """What both stacks share: their layers' template cells, their dropout
  rates, and the zero state and weight drop of those layers. Every field
  but `cells` is keyword-only."""

  cells: Sequence[nn.RNNCellBase]
  _: dataclasses.KW_ONLY
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  dropout_output: float = 0.0
  weight_drop: float = 0.0
  unroll: int = 1
  scan: str = 'auto'

  dropout_rates: ClassVar[tuple[str, ...]] = STACK_DROPOUT_RATES

  def __post_init__(self):
    object.__setattr__(self, 'cells', tuple(self.cells))
    super().__post_init__()

  @nn.nowrap
  def initialize_carry(
    self, batch_size: int, input_size: int, rng: jax.Array | None = None
  ) -> list[Any]:
    """The zero state of every layer for `batch_size` streams of `input_size`
    (a layer's input size is the output size of the one below)."""
    rng = jax.random.key(0) if rng is None else rng
    carries, size = [], input_size
    for key, cell in zip(jax.random.split(rng, len(self.cells)), self.cells):
      carries.append(cell.initialize_carry(key, (batch_size, size)))
      size = carry_output(carries[-1]).shape[-1]
    return carries

  @nn.nowrap
  def dropped_weights(self, params: Any, rng: jax.Array) -> Any:
    """The stack's `params` with weight drop on every layer's hidden-to-hidden
    matrices (`cell_{i}/...`); unchanged without."""
    if self.weight_drop == 0:  # no cell need declare its matrices then
      return params
    paths = [
      f'cell_{i}/{path}' for i, cell in enumerate(self.cells) for path in hidden_to_hidden(cell)
    ]
    return drop_recurrent_weights(params, paths, self.weight_drop, rng)


class Stack(_Layers):
  """Layers of cells one after another, each run over the window by a
  `RecurrentLayer`:

    x^(0) = x,  (c^(l), x^(l)) = layer_l(c^(l), D_hidden(x^(l-1))),
    y = D_output(x^(L))  (or D_output(Σ_l x^(l)) with `skip_connections`)

  where D_hidden drops the input of every layer but the first, and each
  layer's fed-back h is multiplied by a mask drawn once per window
  (`dropout_state`; Gal & Ghahramani 2016). The between-layer and output
  masks are drawn once per window when `variational`, else at every step
  (lamb's `shared_mask_dropout=False`; the state mask stays one per window).
  With `skip_connections` the output is the sum of every layer's undropped
  output (lamb's `skip_multi_rnn_cell.py`; all layers must then be of one
  size). `weight_drop` (DropConnect on every hidden-to-hidden matrix) acts on
  the parameters before the model runs (`dropped_weights`). The undropped
  and dropped output are sown into 'intermediates' as `output` and
  `dropped_output` (for AR and TAR).

    >>> stack = Stack([LSTMCell(8), LSTMCell(8)], dropout_hidden=0.2)
    >>> carries = stack.initialize_carry(batch_size=4, input_size=6)
    >>> variables = stack.init(key, carries, jnp.ones((10, 4, 6)), train=False)
    >>> carries, y = stack.apply(variables, carries, jnp.ones((10, 4, 6)), train=False)

  Its parameters are each layer's cell's, at `cell_{i}/...`.

  Attributes:
    cells: one unbound cell per layer, bottom first (each layer runs a copy).
    dropout_hidden, dropout_state, dropout_output, weight_drop: rates.
    variational: share the between-layer and output masks over time.
    skip_connections: the output is the sum of the layers' outputs.
    unroll: scan steps per loop iteration.
    scan: how each layer runs a window (`lm_zoo.cells.scans`).
  """

  _: dataclasses.KW_ONLY
  variational: bool = True
  skip_connections: bool = False

  @nn.compact
  def __call__(
    self, carries: Sequence[Any], inputs: jax.Array, *, train: bool, steps: jax.Array | None = None
  ) -> tuple[list[Any], jax.Array]:
    """inputs (T, B, m) time-major -> (new carries, dropped output (T, B, n));
    `steps`: the window's own steps (`RecurrentLayer`)."""
    new_carries, x, total = [], inputs, None
    for layer, (cell, carry) in enumerate(zip(_own_cells(self.cells), carries)):
      if layer > 0:
        x = nn.Dropout(
          self.dropout_hidden,
          broadcast_dims=(0,) if self.variational else (),
          deterministic=not train,
        )(x)
      state_mask = None
      if train and self.dropout_state > 0:
        h = carry_output(carry)
        state_mask = nn.Dropout(self.dropout_state, deterministic=False)(jnp.ones(h.shape, h.dtype))
      carry, x = RecurrentLayer(cell, unroll=self.unroll, scan=self.scan, name=f'layer_{layer}')(
        carry, x, state_mask, steps
      )
      new_carries.append(carry)
      if self.skip_connections:
        total = x if total is None else _summed(total, x, layer)
    h = x if total is None else total
    return new_carries, _dropped_output(h, self.dropout_output, self.variational, train, self.sow)


def _summed(total: jax.Array, x: jax.Array, layer: int) -> jax.Array:
  if x.shape != total.shape:
    raise ConfigError(
      f"skip connections sum the layers' outputs, but layer {layer} "
      f'has {x.shape[-1]} units and the layers below '
      f'{total.shape[-1]}: give every layer one size'
    )
  return total + x


class LSTMRHN(_Layers):
  """aLSTM layers with recurrent adaptation models stepped together as the
  LSTM-RHN of the aLSTM paper's eq. (9) (`LSTMRHNStack`, run by one
  `RecurrentLayer`); its dropout is always variational, and it has no skip
  connections.

    >>> stack = LSTMRHN([ALSTMCell(8, latent_size=4), ALSTMCell(8, latent_size=4)])

  Its parameters are each layer's cell's, at `cell_{i}/...`, as `Stack`'s.

  Attributes:
    cells: one unbound `ALSTMCell` per layer, bottom first.
    dropout_hidden, dropout_state, dropout_output, weight_drop: as `Stack`'s.
    unroll: scan steps per loop iteration.
    scan: how the stepped layers run a window (`lm_zoo.cells.scans`).
  """

  @nn.compact
  def __call__(
    self, carries: Sequence[Any], inputs: jax.Array, *, train: bool, steps: jax.Array | None = None
  ) -> tuple[list[Any], jax.Array]:
    """inputs (T, B, m) time-major -> (new carries, dropped output (T, B, n));
    `steps`: the window's own steps (`RecurrentLayer`)."""
    rhn = LSTMRHNStack(
      _own_cells(self.cells),
      self.dropout_hidden,
      self.dropout_state,
      deterministic=not train,
      name='lstm_rhn',
    )
    carries, h = RecurrentLayer(rhn, unroll=self.unroll, scan=self.scan, name='layer')(
      tuple(carries), inputs, None, steps
    )
    return list(carries), _dropped_output(h, self.dropout_output, True, train, self.sow)
