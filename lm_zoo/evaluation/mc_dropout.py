"""Monte-Carlo dropout evaluation (Gal & Ghahramani 2016): the predicted
probabilities averaged over dropout masks."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.models.objective import token_nll


def with_dropout_scaled(model: nn.Module, factor: float) -> nn.Module:
  """`model` with each of its dropout rates (fields named dropout_* and
  weight_drop, and the dropout_* arguments its cells are built with, such as
  the aLSTM's dropout_latent) multiplied by `factor`: MC-dropout's rate
  multiplier."""
  rates = {f.name: getattr(model, f.name) * factor for f in dataclasses.fields(model)
           if f.name.startswith('dropout_') or f.name == 'weight_drop'}
  factory = getattr(model, 'cell_factory', None)
  cell_rates = ({k: v * factor for k, v in factory.keywords.items() if k.startswith('dropout_')}
                if isinstance(factory, functools.partial) else {})
  too_high = {name: rate for name, rate in {**rates, **cell_rates}.items()
              if not 0 <= rate < 1}
  if too_high:
    raise ValueError(f'dropout scaled by {factor} leaves rates outside [0, 1): {too_high}')
  if cell_rates:
    rates['cell_factory'] = functools.partial(factory.func, *factory.args,
                                              **{**factory.keywords, **cell_rates})
  return model.clone(**rates)


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
    if hasattr(model, 'dropped_weights'):
      params = model.dropped_weights(params, weight_key)
    logits, carries = model.apply({'params': params}, inputs, carries, train=True,
                                  rngs={'dropout': dropout_key})
    return logits, carries

  def eval_step(params, carries, inputs, targets, weights, temperature=1.0):
    sample_carries, key = carries
    key, window_key = jax.random.split(key)
    logits, sample_carries = jax.vmap(one_sample, in_axes=(None, 0, None, 0))(
        params, sample_carries, inputs, jax.random.split(window_key, num_samples))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature)
    mixed = jax.nn.logsumexp(log_probs, axis=0) - jnp.log(num_samples)
    # mixed is normalised, so the cross-entropy's log-softmax leaves it as is.
    total, count = token_nll(mixed, targets, weights)
    return total, count, (sample_carries, key)

  return jax.jit(eval_step)


def mc_dropout_carries(model: nn.Module, batch_size: int, num_samples: int,
                       rng: jax.Array) -> tuple[Any, jax.Array]:
  """Initial carries of `make_mc_dropout_eval_step`'s step: the zero state
  repeated for every sample, and the key of the masks."""
  carries = model.initialize_carry(batch_size)
  stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_samples, *x.shape)), carries)
  return stacked, rng
