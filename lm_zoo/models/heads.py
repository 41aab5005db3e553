"""What `RecurrentLM` puts after its stack: an optional bridge (the dual
connection) and a head (a softmax, a tied softmax, a mixture of softmaxes).

Each is a module, the model's child `bridge` or `head`. A head maps the
batch-major output h (B, T, n) and the embedding matrix E (V, d) to logits
(B, T, V), or to normalised log-probabilities, which every loss and sampler
reads the same way. A part built on a layer of `lm_zoo.layers` shares that
layer's scope (`nn.share_scope`), so the layer's parameters are the part's
own: `head/kernel`, not `head/OutputEmbedding_0/kernel`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax

from lm_zoo.layers import DualConnection, MixtureOfSoftmaxes, OutputEmbedding
from lm_zoo.layers.products import attend, dense


class Dual(nn.Module):
  """The dual connection (`DualConnection`) between the stack and the head:

    d_t = D_out(ReLU(W_d D_in([e_t; h_t]) + b_d))

  of the embedded word e_t and the stack's dropped output h_t, so that the
  current input reaches the head by a path that skips the recurrence. Its
  parameters are `dense/kernel` and `dense/bias`.

    >>> model = RecurrentLM(Embedding(50, 8), Stack([LSTMCell(8)]), Softmax(50),
    ...                     bridge=Dual(16))

  Attributes:
    features: the dual size.
    dropout_input, dropout_output: rates on [e_t; h_t] and on d_t.
    variational: one mask per window (else per step).
    dtype: the product's dtype (None: from the inputs).
  """

  features: int
  dropout_input: float = 0.0
  dropout_output: float = 0.0
  variational: bool = True
  dtype: Any = None

  dropout_rates: ClassVar[tuple[str, ...]] = ('dropout_input', 'dropout_output')

  @nn.compact
  def __call__(self, embedded: jax.Array, h: jax.Array, *, train: bool) -> jax.Array:
    """e (T, B, d) and h (T, B, n) -> (T, B, features)."""
    connection = DualConnection(
      self.features,
      self.dropout_input,
      self.dropout_output,
      broadcast_dims=(0,) if self.variational else (),
      dtype=self.dtype,
    )
    nn.share_scope(self, connection)
    return connection(embedded, h, deterministic=not train)


def _flat(h: jax.Array) -> jax.Array:
  # The softmax's products on (B·T, features): XLA's CPU backend runs the
  # 2-d products and their gradients faster than 3-d ones.
  return h.reshape(-1, h.shape[-1])


class Softmax(nn.Module):
  """Logits from a matrix of the head's own (`OutputEmbedding`):

    logits_t = W h_t + b

  with W (V, n) at `kernel` and b at `bias`.

    >>> head = Softmax(vocab_size=50)

  Attributes:
    vocab_size: number of token types V.
    dtype: the product's dtype (None: from the inputs).
  """

  vocab_size: int
  dtype: Any = None

  @nn.compact
  def __call__(self, h: jax.Array, embedding: jax.Array, *, train: bool) -> jax.Array:
    """h (B, T, n) and E (unused) -> logits (B, T, V)."""
    output = OutputEmbedding(self.vocab_size, dtype=self.dtype)
    nn.share_scope(self, output)
    return output(_flat(h)).reshape(*h.shape[:2], -1)


class TiedSoftmax(nn.Module):
  """Logits from the embedding matrix E (V, d):

    logits_t = E (P h_t) + b

  with a linear projection P (`projection/kernel`) when h's size n is not
  the embedding's d (else P = I), and a bias of the head's own (`bias`).

    >>> head = TiedSoftmax(vocab_size=50)

  Attributes:
    vocab_size: number of token types V.
    dtype: the products' dtype (None: from the inputs).
  """

  vocab_size: int
  dtype: Any = None

  @nn.compact
  def __call__(self, h: jax.Array, embedding: jax.Array, *, train: bool) -> jax.Array:
    """h (B, T, n) and E (V, d) -> logits (B, T, V)."""
    batch_time, h = h.shape[:2], _flat(h)
    if h.shape[-1] != embedding.shape[-1]:
      h = dense(embedding.shape[-1], self.dtype, use_bias=False, name='projection')(h)
    bias = self.param('bias', nn.initializers.zeros_init(), (self.vocab_size,))
    return (attend(h, embedding, self.dtype) + bias).reshape(*batch_time, -1)


class MixtureHead(nn.Module):
  """A mixture of softmaxes (`MixtureOfSoftmaxes`) whose latents have the
  embedding's size d:

    P(y | h) = Σ_k π_k softmax(E g_k + b)(y),  π = softmax(W_p h),
    g_k = D(tanh(W_k h + b_k))

  returning normalised log-probabilities; the softmaxes' E is the head's own
  (`softmax/kernel`, d x V) or, when `tied`, the embedding matrix. Its
  parameters: `prior/kernel`, `latent/kernel`, `latent/bias`,
  `softmax/kernel` (untied) and `bias`.

    >>> head = MixtureHead(vocab_size=50, components=3, dropout_latent=0.3, tied=True)

  Attributes:
    vocab_size: number of token types V.
    components: the number of softmaxes K.
    dropout_latent: dropout rate on the latents g_k.
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

  @nn.compact
  def __call__(self, h: jax.Array, embedding: jax.Array, *, train: bool) -> jax.Array:
    """h (B, T, n) and E (V, d) -> log-probabilities (B, T, V)."""
    mixture = MixtureOfSoftmaxes(
      self.vocab_size,
      self.components,
      embedding.shape[-1],
      dropout_latent=self.dropout_latent,
      broadcast_dims=(1,) if self.variational else (),
      dtype=self.dtype,
    )
    nn.share_scope(self, mixture)
    return mixture(h, embedding if self.tied else None, deterministic=not train)
