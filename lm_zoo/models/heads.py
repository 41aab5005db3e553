"""What `RecurrentLM` puts after its stack: an optional bridge (the dual
connection) and a head (a softmax, a tied softmax, a mixture of softmaxes).

Parts, as in `lm_zoo.models.stacks`: frozen dataclasses that the model
calls with itself, declaring their modules and parameters in the model's
scope under the names models had before they were built from parts ('dual',
'softmax', 'projection' and 'softmax_bias', 'mos').

A head maps the batch-major output h (B, T, n) and the embedding matrix
(V, d) to logits (B, T, V), or to normalised log-probabilities, which every
loss and sampler reads the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax

from lm_zoo.layers import DualConnection, MixtureOfSoftmaxes, OutputEmbedding
from lm_zoo.layers.products import attend, dense


@dataclasses.dataclass(frozen=True)
class Dual:
  """The dual connection (`DualConnection`): the head reads
  ReLU(W_d [e_t; h_t] + b_d) of the embedded word e_t and the stack's
  dropped output h_t; 'dual' in the model's parameters.

  Attributes:
    features: the dual size.
    dropout_input, dropout_output: rates on [e_t; h_t] and on the result.
    variational: one mask per window (else per step).
    dtype: the product's dtype (None: from the inputs).
  """

  features: int
  dropout_input: float = 0.0
  dropout_output: float = 0.0
  variational: bool = True
  dtype: Any = None

  dropout_rates: ClassVar[tuple[str, ...]] = ('dropout_input', 'dropout_output')

  def __call__(self, model: nn.Module, embedded: jax.Array, h: jax.Array, *,
               train: bool) -> jax.Array:
    """e (T, B, d) and h (T, B, n) -> (T, B, features)."""
    return DualConnection(self.features, self.dropout_input, self.dropout_output,
                          broadcast_dims=(0,) if self.variational else (), dtype=self.dtype,
                          parent=model, name='dual')(embedded, h, deterministic=not train)


def _flat(h: jax.Array) -> jax.Array:
  # The softmax's products on (B·T, features): XLA's CPU backend runs the
  # 2-d products and their gradients faster than 3-d ones.
  return h.reshape(-1, h.shape[-1])


@dataclasses.dataclass(frozen=True)
class Softmax:
  """Logits h Wᵀ + b from a matrix of the head's own (`OutputEmbedding`,
  'softmax' in the model's parameters).

  Attributes:
    vocab_size: number of token types.
    dtype: the product's dtype (None: from the inputs).
  """

  vocab_size: int
  dtype: Any = None

  def __call__(self, model: nn.Module, h: jax.Array, embedding: jax.Array, *,
               train: bool) -> jax.Array:
    logits = OutputEmbedding(self.vocab_size, dtype=self.dtype, parent=model,
                             name='softmax')(_flat(h))
    return logits.reshape(*h.shape[:2], -1)


@dataclasses.dataclass(frozen=True)
class TiedSoftmax:
  """Logits (P h) Eᵀ + b from the embedding matrix E, with a linear
  projection P ('projection') when h's size is not the embedding's and a
  bias of the head's own ('softmax_bias').

  Attributes:
    vocab_size: number of token types.
    dtype: the products' dtype (None: from the inputs).
  """

  vocab_size: int
  dtype: Any = None

  def __call__(self, model: nn.Module, h: jax.Array, embedding: jax.Array, *,
               train: bool) -> jax.Array:
    batch_time, h = h.shape[:2], _flat(h)
    if h.shape[-1] != embedding.shape[-1]:
      h = dense(embedding.shape[-1], self.dtype, use_bias=False, parent=model,
                name='projection')(h)
    bias = model.param('softmax_bias', nn.initializers.zeros_init(), (self.vocab_size,))
    return (attend(h, embedding, self.dtype) + bias).reshape(*batch_time, -1)


@dataclasses.dataclass(frozen=True)
class MixtureHead:
  """A mixture of softmaxes (`MixtureOfSoftmaxes`, 'mos'): normalised
  log-probabilities, from latents of the embedding's size, E tied to the
  embedding when `tied`.

  Attributes:
    vocab_size: number of token types.
    components: the number of softmaxes.
    dropout_latent: dropout rate on the latents.
    variational: one mask per window (else per step).
    tied: the softmaxes' E is the embedding matrix.
    dtype: the products' dtype (None: from the inputs).
  """

  vocab_size: int
  components: int
  dropout_latent: float = 0.0
  variational: bool = True
  tied: bool = False
  dtype: Any = None

  dropout_rates: ClassVar[tuple[str, ...]] = ('dropout_latent',)

  def __call__(self, model: nn.Module, h: jax.Array, embedding: jax.Array, *,
               train: bool) -> jax.Array:
    mixture = MixtureOfSoftmaxes(self.vocab_size, self.components, embedding.shape[-1],
                                 dropout_latent=self.dropout_latent,
                                 broadcast_dims=(1,) if self.variational else (),
                                 dtype=self.dtype, parent=model, name='mos')
    return mixture(h, embedding if self.tied else None, deterministic=not train)

