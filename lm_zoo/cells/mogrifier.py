"""The Mogrifier (Melis et al., ICLR 2020) as a wrapper around any cell."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax

from lm_zoo.cells.base import carry_output, replace_carry_output
from lm_zoo.layers import LowRankDense


def _gate(x: jax.Array) -> jax.Array:
  return 2.0 * nn.sigmoid(x)  # 2σ(0) = 1: fresh rounds start near the identity


class Mogrify(nn.RNNCellBase):
  """Mogrifies x and the previous output h, then calls `cell`.

  Equations (1) and (2) of the paper, with x^{-1} = x and h^0 = h:

      odd i:  x^i = 2σ(Q^i h^{i-1}) ⊙ x^{i-2}
      even i: h^i = 2σ(R^i x^{i-1}) ⊙ h^{i-2}

  for i = 1..rounds, then `cell((..., h^↑), x^↑)`. Each round has its own
  `LowRankDense` (rank <= 0: full rank). With `zigzag=False` (the paper's
  no-zigzag ablation) every round looks at the original inputs:
  x^i = 2σ(Q^i h) ⊙ x^{i-2}, h^i = 2σ(R^i x) ⊙ h^{i-2}. Only h in the carry
  is touched (an LSTM's c is not); apply dropout to x and h before this cell,
  as our stacks do.

  Attributes:
    cell: the inner cell; its carry is h or a tuple ending in h.
    rounds: r; 0 gives the inner cell unchanged.
    rank: k of Q^i = Q_left Q_right; <= 0 for full-rank matrices.
    zigzag: False for the no-zigzag ablation.
    dtype: computation dtype of Q^i and R^i (None: from the inputs).
  """

  cell: nn.RNNCellBase
  rounds: int = 5
  rank: int = 0
  zigzag: bool = True
  dtype: Any = None

  @nn.compact
  def __call__(self, carry, inputs: jax.Array):
    x, h = inputs, carry_output(carry)
    x0, h0 = x, h
    for i in range(1, self.rounds + 1):
      if i % 2:
        source = h if self.zigzag else h0
        x = _gate(LowRankDense(x.shape[-1], self.rank, dtype=self.dtype, name=f'q{i}')(source)) * x
      else:
        source = x if self.zigzag else x0
        h = _gate(LowRankDense(h.shape[-1], self.rank, dtype=self.dtype, name=f'r{i}')(source)) * h
    return self.cell(replace_carry_output(carry, h), x)

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    return self.cell.initialize_carry(rng, input_shape)

  @property
  def num_feature_axes(self) -> int:
    return self.cell.num_feature_axes


def mogrified(make_cell: Callable[..., nn.RNNCellBase], rounds: int = 5, rank: int = 0,
              zigzag: bool = True, dtype: Any = None) -> Callable[..., Mogrify]:
  """A cell factory: `mogrified(LSTMCell, 5, 40)(features=n)` is
  `Mogrify(LSTMCell(n), 5, 40)`, for stacks and models that take factories."""

  def factory(features: int, **kwargs) -> Mogrify:
    # parent=None: the inner cell becomes Mogrify's child `cell`
    return Mogrify(make_cell(features=features, parent=None), rounds=rounds, rank=rank,
                   zigzag=zigzag, dtype=dtype, **kwargs)
  return factory
