"""lm_zoo's cells with Flax NNX's face: `NNXCell(cell, in_features, rngs=...)`
runs any of our linen cells, `Mogrify` around them included, as an
`nnx.RNNCellBase`, in `nnx.RNN` and `nnx.Bidirectional`:

  from flax import nnx
  cell = NNXCell(Mogrify(LSTMCell(256), rounds=5, rank=40), in_features=128,
                 rngs=nnx.Rngs(0))
  outputs = nnx.RNN(cell)(inputs)  # (batch, time, 128) -> (batch, time, 256)

The parameters are the linen cell's own tree (`linen_params`,
`load_linen_params`): weights trained with either face run in the other.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import bridge


class _Nested(nn.Module):
  """The cell one level down, under the name 'cell'. flax's `ToNNX` looks
  each top-level parameter name up among the wrapped class's attributes and
  takes a callable one for a method: `ALSTMCell`'s adaptation model is its
  field `latent` (a constructor) and its parameters' name too."""

  cell: nn.RNNCellBase

  def __call__(self, carry, inputs):
    return self.cell(carry, inputs)


class NNXCell(nnx.RNNCellBase):
  """A linen `nn.RNNCellBase` (`LSTMCell`, `Mogrify(...)`, `MLSTMCell`,
  `ALSTMCell`, flax's own) as an NNX cell, its parameters created at once
  for inputs of `in_features`.

  Attributes:
    cell: the linen cell (its settings; its parameters live in `module`).
    in_features: the size of the inputs it reads.
    module: the cell as an NNX module (`flax.nnx.bridge.ToNNX`), its
      parameters under 'cell'.
  """

  def __init__(self, cell: nn.RNNCellBase, in_features: int, *, rngs: nnx.Rngs):
    if in_features < 1:
      raise ValueError(f'in_features must be at least 1, got {in_features}')
    self.cell = cell
    self.in_features = in_features
    self.module = bridge.ToNNX(_Nested(cell), rngs=rngs)
    carry = cell.initialize_carry(jax.random.key(0), (1, in_features))
    bridge.lazy_init(self.module, carry, jnp.zeros((1, in_features)))

  def __call__(self, carry, inputs: jax.Array):
    """One step: `(new carry, output) = cell(carry, inputs)`."""
    return self.module(carry, inputs)

  def initialize_carry(
    self, input_shape: tuple[int, ...], rngs: Any = None, carry_init: Any = None
  ):
    """The linen cell's initial carry (zeros, or its own `carry_init`) for
    inputs of `input_shape` (batch dimensions, then features)."""
    if carry_init is not None:
      raise ValueError(
        'NNXCell takes its initial carry from the linen cell: set the '
        "cell's carry_init instead of passing one"
      )
    key = rngs.carry() if isinstance(rngs, nnx.Rngs) else jax.random.key(0)
    return self.cell.initialize_carry(key, input_shape)

  @property
  def num_feature_axes(self) -> int:
    return self.cell.num_feature_axes

  def linen_params(self) -> dict[str, Any]:
    """The parameters as the linen cell's `params` tree."""
    return nnx.to_pure_dict(nnx.state(self.module, nnx.Param))['cell']

  def load_linen_params(self, params: dict[str, Any]) -> None:
    """Sets the parameters from a linen `params` tree of the same cell."""
    state = nnx.state(self.module, nnx.Param)
    expected = jax.tree.map(jnp.shape, nnx.to_pure_dict(state)['cell'])
    if jax.tree.map(jnp.shape, params) != expected:
      raise ValueError(f'the linen parameters do not fit this cell: expected the shapes {expected}')
    nnx.replace_by_pure_dict(state, {'cell': params})
    nnx.update(self.module, state)
