"""The language-modelling objective every loop shares: the negative
log-likelihood of a window's targets (training, evaluation, dynamic
evaluation, gradient statistics and meta-training all score windows this way).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


def token_nll(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Summed negative log-likelihood of weighted targets, and the weight sum.

  `logits` may also be normalised log-probabilities (a mixture of softmaxes
  returns them): the log-softmax leaves those unchanged.
  """
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(nll * weights), jnp.sum(weights)


def window_loss(
  model: nn.Module,
  params: Any,
  carries: Any,
  inputs: jax.Array,
  targets: jax.Array,
  weights: jax.Array,
  temperature: float = 1.0,
  **apply_kwargs,
):
  """The mean NLL per scored token of one window, from `carries`:

    mean = sum_t w_t (-log p(y_t | x_<=t)) / max(sum_t w_t, 1)

  with the logits divided by the softmax `temperature`; `apply_kwargs` go to
  `model.apply` (dropout off unless they say `train=True`).

  Returns `(mean, (total, count, new_carries))`, so that
  `jax.grad(window_loss, argnums=1, has_aux=True)` gives the gradient with
  respect to `params` and the window's score.
  """
  logits, new_carries = model.apply({'params': params}, inputs, carries, **apply_kwargs)
  total, count = token_nll(logits / temperature, targets, weights)
  return total / jnp.maximum(count, 1.0), (total, count, new_carries)


def check_token_ids(ids: Any, vocab_size: int, name: str = 'stream') -> None:
  """Refuses ids outside the model's vocabulary [0, vocab_size): the
  embedding would read NaN for them, and every score would be NaN."""
  ids = np.asarray(ids)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(
      f"{name}: token ids must be in [0, {vocab_size}), the model's "
      f'vocabulary; got ids from {ids.min()} to {ids.max()}'
    )
