"""A linear map that is full rank, or factorised as a product of two thin ones."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.layers.products import matmul


def factor_init(num_inputs: int, rank: int):
  """lamb's initialiser of low-rank factors: truncated_normal(stddev=s) with
  s = (1 / (num_inputs * rank)) ** (1/4).

  As in TensorFlow, the normal is cut at ±2s without rescaling, so a factor's
  spread is 0.88 s and an entry of the product of two factors has variance
  rank * (0.88 s)^4 ≈ 0.6 / num_inputs.
  """
  return nn.initializers.truncated_normal((1.0 / (num_inputs * rank)) ** 0.25)


class LowRankDense(nn.Module):
  """y = x A B + b, with A (m, k) and B (k, n); `rank <= 0` gives y = x W + b.

  The Mogrifier's Q^i = Q^i_left Q^i_right (docs/models.md §2) in
  row-vector form: A = Q_right^T, B = Q_left^T. The bias starts at zero.
  Parameters: m k + k n (+ n), against m n (+ n) at full rank.

  Attributes:
    features: output size n.
    rank: k; <= 0 means a full-rank kernel.
    use_bias: add b.
    dtype: the products' dtype (None: from the inputs; bfloat16 sums and
      returns float32, `products.einsum`).
    param_dtype: parameter dtype.
  """

  features: int
  rank: int = 0
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    m = x.shape[-1]
    if self.rank > min(m, self.features):
      raise ValueError(
        f'LowRankDense: rank {self.rank} is larger than the ({m}, '
        f'{self.features}) matrix it factorises: use a rank of at most '
        f'{min(m, self.features)}, or 0 for full rank'
      )
    if self.rank > 0:
      params = {
        'kernel_in': self.param(
          'kernel_in', factor_init(m, self.rank), (m, self.rank), self.param_dtype
        ),
        'kernel_out': self.param(
          'kernel_out', factor_init(m, self.rank), (self.rank, self.features), self.param_dtype
        ),
      }
    else:
      params = {
        'kernel': self.param(
          'kernel', nn.initializers.lecun_normal(), (m, self.features), self.param_dtype
        )
      }
    if self.use_bias:
      params['bias'] = self.param(
        'bias', nn.initializers.zeros_init(), (self.features,), self.param_dtype
      )
    return low_rank_linear(params, x, self.dtype)[0]


def low_rank_linear(
  params: dict, x: jax.Array, dtype: Any = None
) -> tuple[jax.Array, jax.Array | None]:
  """`LowRankDense`'s map given its parameters: (x A B + b, x A), or
  (x W + b, None) at full rank; b only when `params` has a bias. Products
  are `matmul`s in `dtype` (float32 results for bfloat16)."""
  if 'kernel_in' in params:
    hidden = matmul(x, params['kernel_in'], dtype)
    y = matmul(hidden, params['kernel_out'], dtype)
  else:
    hidden, y = None, matmul(x, params['kernel'], dtype)
  if 'bias' in params:
    y = y + params['bias'].astype(y.dtype)
  return y, hidden
