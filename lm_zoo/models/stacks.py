"""The recurrent part of `RecurrentLM`: cells one after another (`Stack`), or
aLSTM cells stepped together (`LSTMRHN`).

A part is a frozen dataclass, not a module: `RecurrentLM` calls it with
itself, and the part declares its modules in the model's scope, under the
names models had before they were built from parts (each layer's cell
`cell_{i}` beside `stack`), so that their parameter trees and dropout masks
stay those of checkpoints written then. Its cells are unbound templates,
copied into the model as `cell_{i}`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import flax.linen as nn
import jax

from lm_zoo.cells import LSTMRHNStack, carry_output
from lm_zoo.models.recurrent import RecurrentLayer, RecurrentStack
from lm_zoo.models.regularisation import drop_recurrent_weights, hidden_to_hidden


def _initialize_carry(cells, batch_size: int, input_size: int, rng: jax.Array | None):
  """Every layer's zero state; a layer's input size is the one below's output's."""
  rng = jax.random.key(0) if rng is None else rng
  carries, size = [], input_size
  for key, cell in zip(jax.random.split(rng, len(cells)), cells):
    carries.append(cell.initialize_carry(key, (batch_size, size)))
    size = carry_output(carries[-1]).shape[-1]
  return carries


def _dropped_weights(cells, rate: float, params: Any, rng: jax.Array) -> Any:
  """Weight drop on every layer's hidden-to-hidden matrices (`cell_{i}/...`)."""
  if rate == 0:  # no cell need declare its matrices then
    return params
  paths = [f'cell_{i}/{path}' for i, cell in enumerate(cells) for path in hidden_to_hidden(cell)]
  return drop_recurrent_weights(params, paths, rate, rng)


def _bound(model: nn.Module, cells):
  """Copies of the template cells in the model's scope (deep: a wrapped cell
  is copied too, so templates that share one do not share its parameters)."""
  return [cell.copy(parent=model, name=f'cell_{i}') for i, cell in enumerate(cells)]


def output_dropout(model: nn.Module, h: jax.Array, rate: float, variational: bool,
                   train: bool) -> jax.Array:
  """Dropout on the stack's output (T, B, n), one mask per window when
  `variational`; the undropped and dropped outputs are sown into the model's
  'intermediates' as `output` and `dropped_output` (for AR and TAR)."""
  model.sow('intermediates', 'output', h)
  h = nn.Dropout(rate, broadcast_dims=(0,) if variational else (), deterministic=not train,
                 parent=model)(h)
  model.sow('intermediates', 'dropped_output', h)
  return h


@dataclasses.dataclass(frozen=True)
class Stack:
  """Layers of cells one after another (`RecurrentStack`): dropout between
  them (`dropout_hidden`) and on each one's fed-back h (`dropout_state`),
  one mask per window, or per step between layers when not `variational`;
  the output is the last layer's, or with `skip_connections` the sum of
  every layer's. `dropout_output` drops it, and `weight_drop` (DropConnect on
  every hidden-to-hidden matrix) acts on the parameters before the model
  runs (`dropped_weights`).

  Attributes:
    cells: one unbound cell per layer, bottom first.
    dropout_hidden, dropout_state, dropout_output, weight_drop: rates.
    variational: share the between-layer and output masks over time.
    skip_connections: the output is the sum of the layers' outputs.
    unroll: scan steps per loop iteration.
    scan: how each layer runs a window (`lm_zoo.cells.scans`).
  """

  cells: Sequence[nn.RNNCellBase]
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  dropout_output: float = 0.0
  weight_drop: float = 0.0
  variational: bool = True
  skip_connections: bool = False
  unroll: int = 1
  scan: str = 'auto'

  dropout_rates: ClassVar[tuple[str, ...]] = ('dropout_hidden', 'dropout_state',
                                              'dropout_output', 'weight_drop')

  def __post_init__(self):
    object.__setattr__(self, 'cells', tuple(self.cells))

  def initialize_carry(self, batch_size: int, input_size: int,
                       rng: jax.Array | None = None) -> list[Any]:
    return _initialize_carry(self.cells, batch_size, input_size, rng)

  def dropped_weights(self, params: Any, rng: jax.Array) -> Any:
    return _dropped_weights(self.cells, self.weight_drop, params, rng)

  def __call__(self, model: nn.Module, carries: Sequence[Any], x: jax.Array, *,
               train: bool) -> tuple[list[Any], jax.Array]:
    """x (T, B, m) -> (new carries, dropped output (T, B, n))."""
    carries, h = RecurrentStack(
        _bound(model, self.cells), dropout_hidden=self.dropout_hidden,
        dropout_state=self.dropout_state, variational_dropout=self.variational,
        unroll=self.unroll, scan=self.scan, skip_connections=self.skip_connections,
        parent=model, name='stack')(carries, x, train=train)
    return carries, output_dropout(model, h, self.dropout_output, self.variational, train)


@dataclasses.dataclass(frozen=True)
class LSTMRHN:
  """aLSTM layers with recurrent adaptation models stepped together as the
  LSTM-RHN of the aLSTM paper's eq. (9) (`LSTMRHNStack`); its dropout is
  always variational, and it has no skip connections.

  Attributes:
    cells: one unbound `ALSTMCell` per layer, bottom first.
    dropout_hidden, dropout_state, dropout_output, weight_drop: as `Stack`'s.
    unroll: scan steps per loop iteration.
    scan: how the stepped layers run a window (`lm_zoo.cells.scans`).
  """

  cells: Sequence[nn.RNNCellBase]
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  dropout_output: float = 0.0
  weight_drop: float = 0.0
  unroll: int = 1
  scan: str = 'auto'

  dropout_rates: ClassVar[tuple[str, ...]] = Stack.dropout_rates

  def __post_init__(self):
    object.__setattr__(self, 'cells', tuple(self.cells))

  def initialize_carry(self, batch_size: int, input_size: int,
                       rng: jax.Array | None = None) -> list[Any]:
    return _initialize_carry(self.cells, batch_size, input_size, rng)

  def dropped_weights(self, params: Any, rng: jax.Array) -> Any:
    return _dropped_weights(self.cells, self.weight_drop, params, rng)

  def __call__(self, model: nn.Module, carries: Sequence[Any], x: jax.Array, *,
               train: bool) -> tuple[list[Any], jax.Array]:
    """x (T, B, m) -> (new carries, dropped output (T, B, n))."""
    rhn = LSTMRHNStack(_bound(model, self.cells), self.dropout_hidden, self.dropout_state,
                       deterministic=not train, parent=model, name='lstm_rhn')
    carries, h = RecurrentLayer(rhn, unroll=self.unroll, scan=self.scan, parent=model,
                                name='stack')(tuple(carries), x)
    return list(carries), output_dropout(model, h, self.dropout_output, True, train)
