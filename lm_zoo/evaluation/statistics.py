"""Gradient statistics of trained weights over training windows: the RMS
training gradient that RMS dynamic evaluation normalises by, and the
diagonal Fisher precision of the learned rule's long-term memory."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.data import BatchedStream
from lm_zoo.models.objective import window_loss


# One jit for every call: the weights of many seeds (or runs) of one model
# share its compiled program.
@functools.partial(jax.jit, static_argnames='model')
def _squared_gradients(model, params, carries, x, y, w):
  grads, (_, _, carries) = jax.grad(window_loss, argnums=1, has_aux=True)(
    model, params, carries, x, y, w
  )
  return jax.tree.map(jnp.square, grads), jax.lax.stop_gradient(carries)


def rms_training_gradients(
  model, params: Any, stream: np.ndarray, batch_size: int, bptt: int, num_batches: int
) -> Any:
  """MS = sqrt(mean over `num_batches` training windows of g^2), per
  coordinate: the statistic `dynamic_rms` normalises by. Gradients are of the
  mean NLL of each window, with no clipping, no L2 and dropout off; the
  recurrent state carries across windows.
  """
  if num_batches < 1:
    raise ValueError(f'num_batches must be at least 1, got {num_batches}')
  sums = jax.tree.map(jnp.zeros_like, params)
  carries, seen = model.initialize_carry(batch_size), 0
  for window in BatchedStream(stream, batch_size).windows(bptt, pad_last=True):
    if seen == num_batches:
      break
    squares, carries = _squared_gradients(
      model, params, carries, window.inputs, window.targets, window.weights
    )
    sums = jax.tree.map(jnp.add, sums, squares)
    seen += 1
  return jax.tree.map(lambda s: jnp.sqrt(s / seen), sums)


def diagonal_fisher(
  model, params: Any, stream, batch_size: int, bptt: int, num_batches: int
) -> Any:
  """The diagonal of the (empirical) Fisher information of the trained
  weights: the mean squared gradient of the LM loss over `num_batches`
  training windows, the precision of the long-term memory theta_0 (EWC)."""
  return jax.tree.map(
    jnp.square, rms_training_gradients(model, params, stream, batch_size, bptt, num_batches)
  )
