"""Sampling text from a recurrent language model."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.models import RecurrentLM


@functools.partial(jax.jit, static_argnames=('model', 'num_tokens'))
def _sample(model: RecurrentLM, params, prompt, rng, temperature, num_tokens):
  carries = model.initialize_carry(prompt.shape[0])
  logits, carries = model.apply({'params': params}, prompt, carries)

  def step(state, key):
    logits, carries = state
    token = jax.random.categorical(key, logits / temperature)
    logits, carries = model.apply({'params': params}, token[:, None], carries)
    return (logits[:, -1], carries), token

  keys = jax.random.split(rng, num_tokens)
  _, tokens = jax.lax.scan(step, (logits[:, -1], carries), keys)
  return tokens.T


def sample(model: RecurrentLM, params: Any, prompt: np.ndarray, num_tokens: int,
           rng: jax.Array, temperature: float = 1.0) -> np.ndarray:
  """Multinomial sampling: `num_tokens` ids after each row of `prompt` (B, P).

  The prompt is read with dropout off; each next token is drawn from
  softmax(logits / temperature). The same `rng` gives the same text.
  """
  if temperature <= 0:
    raise ValueError(f'temperature must be positive, got {temperature}')
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] == 0:
    raise ValueError(f'prompt must be (batch, length>0) ids, got {prompt.shape}')
  return np.asarray(_sample(model, params, prompt, rng, jnp.float32(temperature),
                            num_tokens))
