"""Windows padded past their own steps: a padded step holds the state.

A window of L steps padded to T (so that windows of many lengths share a
few compiled shapes) runs with `steps`, a (T,) bool mask of its own steps,
which come first: True for t < L, False after (the hand-written backward
passes read the steps before each from the outputs, and cuDNN takes a count).
Every way of running a window (`lm_zoo.cells.scans`) then gives, at a step
that is not its own, the carry unchanged and an output of zeros, and in the
backward pass passes the carry's gradient through it unchanged with no
gradient of its own: the window's results and gradients are those of its L
steps alone. `steps=None` is a window of its own steps only, with no extra
operation. Inside a scan, `valid` is one step's entry of `steps` (or None).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def held(valid: jax.Array | None, new: Any, old: Any) -> Any:
  """`new` at a step of the window's own (`valid` True or None), else `old`."""
  if valid is None:
    return new
  return jax.tree.map(lambda n, o: jnp.where(valid, n, o), new, old)


def own(valid: jax.Array | None, value: Any) -> Any:
  """`value` at a step of the window's own, else zeros."""
  if valid is None:
    return value
  return jax.tree.map(lambda v: jnp.where(valid, v, jnp.zeros_like(v)), value)


def output_gradients(
  d_outputs: jax.Array, steps: jax.Array | None, d_final_h: jax.Array
) -> jax.Array:
  """The outputs' gradients (T, B, n) with the final h's added at the
  window's last own step (the last where `steps` is None), zeros at the
  others: what a backward loop that takes the final h's gradient through
  one step's output reads."""
  if steps is None:
    return d_outputs.at[-1].add(d_final_h)
  last = steps & ~jnp.append(steps[1:], False)
  return jnp.where(steps[:, None, None], d_outputs, 0) + last[:, None, None] * d_final_h


def check_steps(steps: jax.Array | None, length: int) -> jax.Array | None:
  """`steps` as a (T,) bool array for a window of `length` steps, or None."""
  if steps is None:
    return None
  steps = jnp.asarray(steps)
  if steps.shape != (length,):
    raise ValueError(
      f"steps must mark each of the window's {length} steps, got shape {steps.shape}"
    )
  return steps.astype(bool)
