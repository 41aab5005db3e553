"""Monte-Carlo dropout evaluation (Gal & Ghahramani 2016): the predicted
probabilities averaged over dropout masks. The model scales its own rates
for a multiplier (`RecurrentLM.with_dropout_scaled`)."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.models.objective import token_nll


def make_mc_dropout_eval_step(model: nn.Module, num_samples: int) -> Callable:
  """Monte-Carlo dropout evaluation (Gal & Ghahramani 2016; the Mogrifier
  paper's 200 samples): the predicted probabilities averaged over
  `num_samples` dropout masks (weight drop included), log p = logsumexp_k
  log p_k - log K.

  Returns jitted `eval_step(params, carries, inputs, targets, weights,
  temperature=1.0)` like `make_eval_step`'s, whose carries are
  `mc_dropout_carries(...)`: one state per sample, each following its own
  masks, and the key the next window's masks come from.
  """
  if num_samples < 1:
    raise ValueError(f'MC dropout needs at least one sample, got {num_samples}')

  def one_sample(params, carries, inputs, key):
    weight_key, dropout_key = jax.random.split(key)
    params = model.dropped_weights(params, weight_key)
    logits, carries = model.apply(
      {'params': params}, inputs, carries, train=True, rngs={'dropout': dropout_key}
    )
    return logits, carries

  def eval_step(params, carries, inputs, targets, weights, temperature=1.0):
    sample_carries, key = carries
    key, window_key = jax.random.split(key)
    logits, sample_carries = jax.vmap(one_sample, in_axes=(None, 0, None, 0))(
      params, sample_carries, inputs, jax.random.split(window_key, num_samples)
    )
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature)
    mixed = jax.nn.logsumexp(log_probs, axis=0) - jnp.log(num_samples)
    # mixed is normalised, so the cross-entropy's log-softmax leaves it as is.
    total, count = token_nll(mixed, targets, weights)
    return total, count, (sample_carries, key)

  return jax.jit(eval_step)


def mc_dropout_carries(
  model: nn.Module, batch_size: int, num_samples: int, rng: jax.Array
) -> tuple[Any, jax.Array]:
  """Initial carries of `make_mc_dropout_eval_step`'s step: the zero state
  repeated for every sample, and the key of the masks."""
  carries = model.initialize_carry(batch_size)
  stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_samples, *x.shape)), carries)
  return stacked, rng
