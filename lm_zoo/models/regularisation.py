"""Regularisers that act on weights, activations and carried states rather
than inside the model's layers: AWD-LSTM's (Merity et al. 2018; docs/models.md
§5) weight drop (DropConnect on the hidden-to-hidden matrices),
activation regularisation (AR) and temporal activation regularisation (TAR),
and lamb's state dropping (docs/models.md §2).

Weight drop transforms the parameter pytree before the model is applied, so
it works with every cell that declares its hidden-to-hidden matrices
(`hidden_to_hidden`), and its mask is drawn once per forward pass: shared
over time and batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# flax's cells keep each hidden-to-hidden matrix in a Dense of its own; ours
# declare theirs (`hidden_to_hidden`, lm_zoo.cells.base).
FLAX_HIDDEN_TO_HIDDEN = {
  nn.OptimizedLSTMCell: ('hi/kernel', 'hf/kernel', 'hg/kernel', 'ho/kernel'),
  nn.LSTMCell: ('hi/kernel', 'hf/kernel', 'hg/kernel', 'ho/kernel'),
  nn.GRUCell: ('hr/kernel', 'hz/kernel', 'hn/kernel'),
  nn.SimpleCell: ('h/kernel',),
}


def hidden_to_hidden(cell: nn.Module) -> tuple[str, ...]:
  """The '/'-joined paths, under `cell`'s own parameters, of its
  hidden-to-hidden matrices: what weight drop masks.

  Raises:
    ValueError: the cell declares none (a custom cell's matrix would
      otherwise go undropped silently).
  """
  if type(cell) in FLAX_HIDDEN_TO_HIDDEN:
    return FLAX_HIDDEN_TO_HIDDEN[type(cell)]
  declare = getattr(cell, 'hidden_to_hidden', None)
  if declare is None:
    raise ValueError(
      f'{type(cell).__name__} does not declare its hidden-to-hidden matrices '
      'for weight drop: give it an nn.nowrap method hidden_to_hidden(of) '
      'returning their paths (lm_zoo.cells.base)'
    )
  return tuple(declare(hidden_to_hidden))


def _names(path) -> str:
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def drop_recurrent_weights(params: Any, paths: Sequence[str], rate: float, rng: jax.Array) -> Any:
  """Weight drop: the matrices of `params` at `paths` ('/'-joined) with
  entries zeroed with probability `rate` and the rest scaled by
  1 / (1 - rate); other parameters unchanged. Gradients reach the kept
  entries through the mask."""
  if not 0 <= rate < 1:
    raise ValueError(f'weight drop rate must be in [0, 1), got {rate}')
  if rate == 0:
    return params
  if not paths:
    raise ValueError(
      'weight drop found no hidden-to-hidden matrix: the cells declare none '
      '(hidden_to_hidden, lm_zoo.cells.base); set the rate to 0'
    )
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  missing = set(paths) - {_names(path) for path, _ in flat}
  if missing:
    raise ValueError(f'weight drop: no parameter at {", ".join(sorted(missing))}')
  # One key per leaf, whether dropped or not, so the masks follow the tree.
  keys = jax.random.split(rng, len(flat))
  leaves = []
  for key, (path, x) in zip(keys, flat):
    if _names(path) in paths:
      keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
      x = jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
    leaves.append(x)
  return jax.tree.unflatten(treedef, leaves)


def activation_penalty(
  outputs: jax.Array, alpha: float, steps: jax.Array | None = None
) -> jax.Array:
  """AR: alpha * mean(h²) over the last layer's dropped outputs (T, B, n);
  with `steps` (T,) bool, over the steps it marks only (a padded window's
  own)."""
  return alpha * _mean_over_steps(jnp.square(outputs), steps)


def temporal_activation_penalty(
  outputs: jax.Array, beta: float, steps: jax.Array | None = None
) -> jax.Array:
  """TAR: beta * mean((h_t - h_{t-1})²) over the last layer's undropped
  outputs (T, B, n), time first; with `steps` (T,) bool, a window's own
  steps first and the rest padding, over the pairs of its own steps."""
  return beta * _mean_over_steps(
    jnp.square(outputs[1:] - outputs[:-1]), None if steps is None else steps[1:]
  )


def _mean_over_steps(x: jax.Array, steps: jax.Array | None) -> jax.Array:
  if steps is None:
    return jnp.mean(x)
  return jnp.mean(x, where=steps[:, None, None])


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
  return jax.tree.map(lambda x: x * keep.reshape(-1, *(1,) * (x.ndim - 1)).astype(x.dtype), carries)
