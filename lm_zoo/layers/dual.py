"""The dual input-to-output connection (dual-connection-current-input.txt;
docs/models.md §4)."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.layers.products import dense


class DualConnection(nn.Module):
  """The dual layer between a recurrent stack and the softmax:

    d_t = ReLU(W_d [e_t; h_t] + b_d)

  so that the current input e_t reaches the softmax by a path that skips the
  recurrence (the dual paper's eqs. 4 to 7; ERS feeds h_t to the softmax
  instead). Dual input dropout acts on [e_t; h_t], dual output dropout on d_t,
  each mask shared along `broadcast_dims` (time, for variational dropout).
  The dual paper's dual L2 is a penalty on this module's parameters
  (`optimizer.dual_l2`).

  Attributes:
    features: the dual size, the length of d_t.
    dropout_input: rate on [e_t; h_t].
    dropout_output: rate on d_t.
    broadcast_dims: axes along which a dropout mask is shared.
    dtype: the product's dtype (None: from the inputs; bfloat16 sums and
      returns float32, `products.dense`).
  """

  features: int
  dropout_input: float = 0.0
  dropout_output: float = 0.0
  broadcast_dims: Sequence[int] = ()
  dtype: Any = None

  @nn.compact
  def __call__(self, e: jax.Array, h: jax.Array, *, deterministic: bool = True) -> jax.Array:
    if e.shape[:-1] != h.shape[:-1]:
      raise ValueError(
        f'the input e {e.shape} and recurrent output h {h.shape} '
        'must agree on every axis but the last'
      )
    x = jnp.concatenate([e, h], axis=-1)
    x = nn.Dropout(
      self.dropout_input, broadcast_dims=self.broadcast_dims, deterministic=deterministic
    )(x)
    d = nn.relu(dense(self.features, self.dtype, name='dense')(x))
    return nn.Dropout(
      self.dropout_output, broadcast_dims=self.broadcast_dims, deterministic=deterministic
    )(d)
