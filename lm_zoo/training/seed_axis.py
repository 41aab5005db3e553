"""The seed axis of a run: every array of its train state has a leading axis
of seeds config.seed, ..., config.seed + N - 1 (N >= 1, one for a run
alone), and the train and evaluation steps are vmapped over it. Here: the
seeds' configs, their trees stacked and taken apart, and where a seed's
own work directory is when N > 1."""

from __future__ import annotations

import pathlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from lm_zoo.errors import ConfigError, is_whole_number


def check_num_seeds(num_seeds: Any) -> None:
  """Raises ConfigError unless `num_seeds` is a whole number of at least 1."""
  if not is_whole_number(num_seeds) or num_seeds < 1:
    raise ConfigError(f'num_seeds must be a whole number of at least 1, got {num_seeds!r}')


def seed_configs(
  config: ml_collections.ConfigDict, num_seeds: int
) -> list[ml_collections.ConfigDict]:
  """The configs of a run's seeds: `config` with seed config.seed + k."""
  configs = []
  for k in range(num_seeds):
    seeded = config.copy_and_resolve_references()
    seeded.seed = config.seed + k
    configs.append(seeded)
  return configs


def seed_dir(workdir: pathlib.Path, seed: int) -> pathlib.Path:
  """The work directory of seed `seed` inside a run of several seeds."""
  return workdir / f'seed_{seed}'


def stack(trees: Sequence[Any]) -> Any:
  """`trees` stacked leaf by leaf on a new leading axis."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def take_seed(tree: Any, k: int) -> Any:
  """Seed `k`'s slice of a stacked tree."""
  return jax.tree.map(lambda leaf: leaf[k], tree)


def select_seeds(mask: Any, on_true: Any, on_false: Any) -> Any:
  """Leaf by leaf, seed k's slice of `on_true` where `mask[k]`, else of
  `on_false` (two stacked trees of one structure)."""
  mask = jnp.asarray(mask)

  def pick(a, b):
    return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

  return jax.tree.map(pick, on_true, on_false)
