"""Regularisers that act on weights, activations and carried states rather
than inside the model's layers: AWD-LSTM's (Merity et al. 2018; MODELS.md
section 5) weight drop (DropConnect on the hidden-to-hidden matrices),
activation regularisation (AR) and temporal activation regularisation (TAR),
and lamb's state dropping (MODELS.md section 2).

Weight drop transforms the parameter pytree before the model is applied, so
it works with every cell whose recurrent matrix `is_recurrent_kernel` finds,
and its mask is drawn once per forward pass: shared over time and batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

# Where the zoo's cells keep their hidden-to-hidden matrices: ours as
# `recurrent_kernel` (LSTMCell) or under a module named `recurrent` (the
# aLSTM's AdaptiveDense), flax's under h* modules (OptimizedLSTMCell hi, hf,
# hg, ho; GRUCell hr, hz, hn; SimpleCell h).
RECURRENT_MODULES = frozenset({'recurrent', 'hi', 'hf', 'hg', 'ho', 'hr', 'hz', 'hn', 'h'})


def is_recurrent_kernel(path: Sequence[str]) -> bool:
  """Whether the parameter at `path` (module names, then the leaf's name) is
  a cell's hidden-to-hidden matrix."""
  *modules, leaf = path
  return leaf == 'recurrent_kernel' or (
      bool(modules) and modules[-1] in RECURRENT_MODULES and leaf.startswith('kernel'))


def _names(path) -> list[str]:
  return [str(getattr(k, 'key', k)) for k in path]


def drop_recurrent_weights(params: Any, rate: float, rng: jax.Array) -> Any:
  """Weight drop: every hidden-to-hidden matrix with entries zeroed with
  probability `rate` and the rest scaled by 1 / (1 - rate); other
  parameters unchanged. Gradients reach the kept entries through the mask."""
  if not 0 <= rate < 1:
    raise ValueError(f'weight drop rate must be in [0, 1), got {rate}')
  if rate == 0:
    return params
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  if not any(is_recurrent_kernel(_names(path)) for path, _ in flat):
    # A custom cell's matrix under another name would silently go undropped.
    raise ValueError('weight drop found no hidden-to-hidden matrix: name it '
                     "'recurrent_kernel', or put it in a submodule named one of "
                     f'{", ".join(sorted(RECURRENT_MODULES))}')
  keys = jax.random.split(rng, len(flat))
  leaves = []
  for key, (path, x) in zip(keys, flat):
    if is_recurrent_kernel(_names(path)):
      keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
      x = jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
    leaves.append(x)
  return jax.tree.unflatten(treedef, leaves)


def recurrent_kernel_paths(params: Any) -> list[str]:
  """The '/'-joined paths that weight drop acts on (to check a model)."""
  return ['/'.join(_names(path)) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
          if is_recurrent_kernel(_names(path))]


def activation_penalty(outputs: jax.Array, alpha: float) -> jax.Array:
  """AR: alpha * mean(h²) over the last layer's dropped outputs (T, B, n)."""
  return alpha * jnp.mean(jnp.square(outputs))


def temporal_activation_penalty(outputs: jax.Array, beta: float) -> jax.Array:
  """TAR: beta * mean((h_t - h_{t-1})²) over the last layer's undropped
  outputs (T, B, n), time first."""
  return beta * jnp.mean(jnp.square(outputs[1:] - outputs[:-1]))


def drop_carried_state(carries: Any, rate: float, rng: jax.Array) -> Any:
  """Each batch row's carried state zeroed with probability `rate`, as lamb's
  `drop_state_probability` does before every training window (`training.py`):
  one draw per row, shared by every layer and every part of its carry (c and
  h alike), and no rescaling of the rows kept. Every leaf of `carries` has the
  batch as its first axis."""
  if not 0 <= rate < 1:
    raise ValueError(f'the state drop rate must be in [0, 1), got {rate}')
  leaves = jax.tree.leaves(carries)
  if rate == 0 or not leaves:
    return carries
  keep = jax.random.bernoulli(rng, 1.0 - rate, (leaves[0].shape[0],))
  return jax.tree.map(
      lambda x: x * keep.reshape(-1, *(1,) * (x.ndim - 1)).astype(x.dtype), carries)
