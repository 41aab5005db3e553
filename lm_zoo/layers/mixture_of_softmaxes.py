"""Mixture of softmaxes (Yang et al. 2018; docs/models.md §6)."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.layers.products import attend, dense


class MixtureOfSoftmaxes(nn.Module):
  """An output head with `num_components` softmaxes mixed by a learned prior:

    pi = softmax(W_p g);  g_k = tanh(W_k g + b_k);
    P(y | g) = sum_k pi_k softmax(E g_k + b)(y)

  The mixture is taken in probability space, computed as
  logsumexp_k(log pi_k + log_softmax(E g_k + b)) so that no probability
  underflows. The call returns log P (..., vocab_size): normalised
  log-probabilities, which any softmax cross-entropy or sampler reads as
  logits unchanged.

  `E` is the module's own matrix (`softmax/kernel`, latent_size x
  vocab_size), or the one passed as `embedding` (vocab_size, latent_size;
  tied with the input embedding, as in the MoS code); `b` (`bias`) is the
  module's own. W_p is `prior/kernel`, the W_k and b_k `latent/kernel` and
  `latent/bias`. Dropout on the latents g_k (`dropout_latent`, the MoS
  code's dropoutl) shares its mask along `broadcast_dims`.

  Attributes:
    vocab_size: number of token types.
    num_components: K, the number of softmaxes.
    latent_size: size of each g_k (the embedding size when E is tied).
    dropout_latent: dropout rate on the latents.
    broadcast_dims: axes of g along which a dropout mask is shared (time, for
      variational dropout).
    dtype: the products' dtype (None: from the inputs; bfloat16 sums and
      returns float32, `products`); the mixture is float32 then.
  """

  vocab_size: int
  num_components: int
  latent_size: int
  dropout_latent: float = 0.0
  broadcast_dims: Sequence[int] = ()
  dtype: Any = None

  @nn.compact
  def __call__(
    self, g: jax.Array, embedding: jax.Array | None = None, *, deterministic: bool = True
  ) -> jax.Array:
    k, d, v = self.num_components, self.latent_size, self.vocab_size
    if k < 1:
      raise ValueError(f'num_components must be at least 1, got {k}')
    if embedding is not None and embedding.shape != (v, d):
      raise ValueError(
        f'a tied embedding must be (vocab_size, latent_size) = ({v}, {d}), got {embedding.shape}'
      )
    log_prior = jax.nn.log_softmax(dense(k, self.dtype, use_bias=False, name='prior')(g))
    latents = jnp.tanh(dense(k * d, self.dtype, name='latent')(g))
    latents = latents.reshape(*g.shape[:-1], k, d)
    # The component axis is new, so the caller's broadcast dims stay valid.
    latents = nn.Dropout(
      self.dropout_latent,
      broadcast_dims=self.broadcast_dims,
      deterministic=deterministic,
      name='latent_dropout',
    )(latents)
    if embedding is None:
      logits = dense(v, self.dtype, use_bias=False, name='softmax')(latents)
    else:
      logits = attend(latents, embedding, self.dtype)
    bias = self.param('bias', nn.initializers.zeros_init(), (v,))
    logits = logits + bias.astype(logits.dtype)
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # (..., K, V)
    return jax.nn.logsumexp(log_prior[..., None] + log_probs, axis=-2)
