"""The Mogrifier (Melis et al., ICLR 2020) as a wrapper around any cell."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.cells.base import carry_output, describe, replace_carry_output
from lm_zoo.errors import is_whole_number
from lm_zoo.layers import LowRankDense, low_rank_linear
from lm_zoo.layers.products import contract

# round i's gate from its source: (2σ(Q^i h) or 2σ(R^i x), the low-rank hidden or None)
RoundGate = Callable[[int, jax.Array], tuple[jax.Array, Any]]


def _gate(x: jax.Array) -> jax.Array:
  return 2.0 * nn.sigmoid(x)  # 2σ(0) = 1: fresh rounds start near the identity


def round_name(i: int) -> str:
  return f'q{i}' if i % 2 else f'r{i}'


def mogrify_rounds(
  x: jax.Array, h: jax.Array, round_gate: RoundGate, rounds: int, zigzag: bool = True
):
  """(x^↑, h^↑) of the paper's equations (1) and (2), and per round i its
  source (h or x), the value it gates (x^{i-2} or h^{i-2}), its gate 2σ(·)
  and its low-rank hidden."""
  x0, h0 = x, h
  trace = []
  for i in range(1, rounds + 1):
    odd = i % 2
    source = (h if zigzag else h0) if odd else (x if zigzag else x0)
    gate, hidden = round_gate(i, source)
    trace.append((source, x if odd else h, gate, hidden))
    if odd:
      x = gate * x
    else:
      h = gate * h
  return x, h, trace


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
  as our stacks do. Around an `LSTMCell`, stacks run whole windows with a
  fused kernel whose backward pass is written by hand (`MogrifierRounds`,
  registered in `lm_zoo.cells.scans`).

  Attributes:
    cell: the inner cell; its carry is h or a tuple ending in h.
    rounds: r; 0 gives the inner cell unchanged.
    rank: k of Q^i = Q_left Q_right; <= 0 for full-rank matrices.
    zigzag: False for the no-zigzag ablation.
    dtype: the products' dtype of Q^i and R^i (None: from the inputs;
      bfloat16 sums in float32 and gates in float32, `products.einsum`).
    param_dtype: the dtype of Q^i and R^i (the inner cell has its own).
  """

  cell: nn.RNNCellBase
  rounds: int = 5
  rank: int = 0
  zigzag: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if not is_whole_number(self.rounds) or self.rounds < 0:
      raise ValueError(
        f'Mogrify: rounds must be an integer >= 0 (0: the inner cell '
        f'unchanged), got {self.rounds!r}'
      )
    if not is_whole_number(self.rank):
      raise ValueError(f'Mogrify: rank must be an integer (<= 0: full rank), got {self.rank!r}')
    if not isinstance(self.cell, nn.Module):
      raise ValueError(
        f'Mogrify: cell must be a cell instance, such as LSTMCell(n), got {self.cell!r}'
      )
    super().__post_init__()

  @nn.compact
  def __call__(self, carry, inputs: jax.Array):
    h = carry_output(carry)
    if not isinstance(h, (jax.Array, np.ndarray)):  # the rounds gate h itself
      raise ValueError(
        f'Mogrify: the inner cell {describe(self.cell)} does not carry its output h '
        f'as an array (its carry ends in a {type(h).__name__}): mogrify each of its '
        "layers' cells instead"
      )

    def round_gate(i, source):
      features = inputs.shape[-1] if i % 2 else h.shape[-1]
      dense = LowRankDense(
        features, self.rank, dtype=self.dtype, param_dtype=self.param_dtype, name=round_name(i)
      )
      return _gate(dense(source)), None

    x, h, _ = mogrify_rounds(inputs, h, round_gate, self.rounds, self.zigzag)
    return self.cell(replace_carry_output(carry, h), x)

  @nn.nowrap
  def hidden_to_hidden(self, of) -> tuple[str, ...]:
    """The inner cell's (weight drop, `lm_zoo.cells.base`); the rounds'
    matrices are not dropped."""
    return tuple(f'cell/{path}' for path in of(self.cell))

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    return self.cell.initialize_carry(rng, input_shape)

  @property
  def num_feature_axes(self) -> int:
    return self.cell.num_feature_axes


@dataclasses.dataclass(frozen=True)
class MogrifierRounds:
  """The Mogrifier's rounds as the `Mix` of `mixed_lstm_recurrence`, with
  their backward pass written out: per step only the gradients of x and h
  pass back through the rounds,

      d z_i = d out_i ⊙ prev_i ⊙ g_i ⊙ (1 - g_i / 2),   g_i = 2σ(z_i),

  and each round's weight gradients (Q_left, Q_right, b) are one matrix
  product each over the whole window, from the sources, low-rank hiddens and
  d z_i the steps kept. Parameters are `Mogrify`'s: {'q1': ..., 'r2': ...},
  each a `LowRankDense`'s.

  Attributes:
    rounds: r >= 1.
    zigzag: False for the no-zigzag ablation.
    dtype: the products' dtype of the rounds, forward and backward (None:
      from the inputs; bfloat16 sums in float32).
  """

  rounds: int
  zigzag: bool = True
  dtype: Any = None

  def __post_init__(self):
    if not is_whole_number(self.rounds) or self.rounds < 1:
      raise ValueError(
        f'MogrifierRounds: rounds must be an integer >= 1 (a Mogrify of no rounds '
        f'is its inner cell, which runs no mix), got {self.rounds!r}'
      )

  def check_params(self, mix_params) -> None:
    """Raises ValueError unless `mix_params` holds exactly these rounds'
    parameters: the rounds read theirs by name, so those of further rounds
    would be ignored and a missing one would fail with a KeyError."""
    names = [round_name(i) for i in range(1, self.rounds + 1)]
    if sorted(mix_params) != sorted(names):
      raise ValueError(
        f'mix_params holds the rounds {sorted(mix_params)}, but mix runs {self.rounds}: '
        f'give {names}, the parameters of Mogrify(cell, rounds={self.rounds})'
      )

  def _trace(self, params, x, h, gates=None):
    """The rounds on x and h; with `gates` (the forward pass's, one per
    round) the chain is rebuilt from them without the matrix products."""

    def round_gate(i, source):
      if gates is not None:
        return gates[i - 1], None
      pre, hidden = low_rank_linear(params[round_name(i)], source, self.dtype)
      return _gate(pre), hidden

    return mogrify_rounds(x, h, round_gate, self.rounds, self.zigzag)

  def _widths(self, params, x, h):
    """Per round: the gate's width and the low-rank hidden's (0 at full rank)."""
    widths = []
    for i in range(1, self.rounds + 1):
      p = params[round_name(i)]
      widths.append(
        (x.shape[-1] if i % 2 else h.shape[-1], p['kernel_in'].shape[-1] if 'kernel_in' in p else 0)
      )
    return widths

  def _unpack(self, params, x, h, residuals):
    """The gates and low-rank hiddens packed by `forward`, per round."""
    widths = self._widths(params, x, h)
    sizes = [w for w, _ in widths] + [k for _, k in widths]
    parts = jnp.split(residuals, list(itertools.accumulate(sizes))[:-1], axis=-1)
    return parts[: self.rounds], parts[self.rounds :]

  def forward(self, params, x, h):
    x, h, trace = self._trace(params, x, h)
    kept = [gate for _, _, gate, _ in trace] + [hid for *_, hid in trace if hid is not None]
    return x, h, jnp.concatenate([k.astype(trace[0][2].dtype) for k in kept], axis=-1)

  def backward(self, params, x, h, residuals, d_x, d_h):
    gates, _ = self._unpack(params, x, h, residuals)
    _, _, trace = self._trace(params, x, h, gates)
    d_x0, d_h0 = jnp.zeros_like(d_x), jnp.zeros_like(d_h)
    d_pre, d_hidden = [None] * self.rounds, [None] * self.rounds
    for i in range(self.rounds, 0, -1):
      _, gated, gate, _ = trace[i - 1]
      odd = i % 2
      d_out = d_x if odd else d_h
      d_z = d_out * gated * gate * (1 - gate / 2)
      d_gated = (d_out * gate).astype(d_out.dtype)
      p = params[round_name(i)]
      dtype = self.dtype or d_z.dtype
      if 'kernel_in' in p:
        d_hidden[i - 1] = contract('bn,kn->bk', d_z, p['kernel_out'], dtype)
        d_source = contract('bk,mk->bm', d_hidden[i - 1], p['kernel_in'], dtype)
      else:
        d_source = contract('bn,mn->bm', d_z, p['kernel'], dtype)
      d_pre[i - 1] = d_z
      if odd:
        d_x = d_gated
        if self.zigzag:
          d_h = d_h + d_source.astype(d_h.dtype)
        else:
          d_h0 = d_h0 + d_source.astype(d_h.dtype)
      else:
        d_h = d_gated
        if self.zigzag:
          d_x = d_x + d_source.astype(d_x.dtype)
        else:
          d_x0 = d_x0 + d_source.astype(d_x.dtype)
    stash = jnp.concatenate(d_pre + [d for d in d_hidden if d is not None], axis=-1)
    return d_x + d_x0, d_h + d_h0, stash

  def params_gradient(self, params, xs, hs, residuals, stashes):
    gates, hiddens = self._unpack(params, xs, hs, residuals)
    d_pres, d_hiddens = self._unpack(params, xs, hs, stashes)
    _, _, trace = self._trace(params, xs, hs, gates)

    grads = {}
    for i, ((source, *_), hidden, d_pre, d_hidden) in enumerate(
      zip(trace, hiddens, d_pres, d_hiddens), start=1
    ):
      p = params[round_name(i)]
      accumulate = jnp.promote_types(p['bias'].dtype if 'bias' in p else source.dtype, jnp.float32)

      def product(a, b):  # Σ over every step and row of aᵀ b
        a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        return contract('ta,tb->ab', a, b, self.dtype or b.dtype).astype(accumulate)

      if 'kernel_in' in p:
        g = {'kernel_in': product(source, d_hidden), 'kernel_out': product(hidden, d_pre)}
      else:
        g = {'kernel': product(source, d_pre)}
      if 'bias' in p:
        g['bias'] = jnp.sum(d_pre.reshape(-1, d_pre.shape[-1]), axis=0, dtype=accumulate)
      grads[round_name(i)] = {k: v.astype(p[k].dtype) for k, v in g.items()}
    return grads


def mogrified(
  make_cell: Callable[..., nn.RNNCellBase],
  rounds: int = 5,
  rank: int = 0,
  zigzag: bool = True,
  dtype: Any = None,
) -> Callable[..., Mogrify]:
  """A cell factory: `mogrified(LSTMCell, 5, 40)(features=n)` is
  `Mogrify(LSTMCell(n), 5, 40)`, for stacks and models that take factories."""

  def factory(features: int, **kwargs) -> Mogrify:
    # parent=None: the inner cell becomes Mogrify's child `cell`
    return Mogrify(
      make_cell(features=features, parent=None),
      rounds=rounds,
      rank=rank,
      zigzag=zigzag,
      dtype=dtype,
      **kwargs,
    )

  return factory
