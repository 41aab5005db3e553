"""The untied softmax layer of a language model."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from lm_zoo.layers.products import attend


class OutputEmbedding(nn.Module):
  """The softmax layer h W^T + b with W stored as (vocab, features), like an
  embedding: on CPU both its forward and its weight-gradient products run
  faster in this layout than a Dense kernel's (features, vocab).

  Attributes:
    vocab_size: number of outputs.
    dtype: the product's dtype (None: from the inputs and parameters;
      bfloat16 sums and returns float32 logits, `products.attend`).
  """

  vocab_size: int
  dtype: Any = None

  @nn.compact
  def __call__(self, h: jax.Array) -> jax.Array:
    kernel = self.param(
      'kernel', nn.initializers.lecun_normal(in_axis=1, out_axis=0), (self.vocab_size, h.shape[-1])
    )
    bias = self.param('bias', nn.initializers.zeros_init(), (self.vocab_size,))
    logits = attend(h, kernel, self.dtype)
    return logits + bias.astype(logits.dtype)
