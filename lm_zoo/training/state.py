"""A run's train state in and out of its checkpoints: a new one (from
`train.init_from` when set), the latest one restored, and where each seed's
best weights go. The state has the seed axis (`lm_zoo.training.seed_axis`);
the checkpoint of a run of one seed holds its state without that axis, as a
train state of one seed is (`create_train_state`)."""

from __future__ import annotations

import logging
import pathlib
from typing import Sequence

import ml_collections
import optax
from jax.sharding import Mesh

from lm_zoo.models import RecurrentLM
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.runs.finished import check_init_from, initial_params
from lm_zoo.runs.workdir import check_resumable
from lm_zoo.training.parallel import place_state
from lm_zoo.training.run import Progress, create_train_state
from lm_zoo.training.seed_axis import seed_dir, stack, take_seed
from lm_zoo.training.steps import TrainState

log = logging.getLogger(__name__)


def open_checkpoints(
  workdir: pathlib.Path, configs: Sequence[ml_collections.ConfigDict]
) -> tuple[Checkpoints, list[Checkpoints]]:
  """The run's checkpoints (WORKDIR/checkpoints and WORKDIR/best), and where
  each seed's best weights go: WORKDIR/best for one seed, WORKDIR/seed_S/best
  for several."""
  checkpoints = Checkpoints(workdir)
  if len(configs) == 1:
    return checkpoints, [checkpoints]
  best = []
  for seeded in configs:
    folder = seed_dir(workdir, seeded.seed)
    folder.mkdir(parents=True, exist_ok=True)
    best.append(Checkpoints(folder))
  return checkpoints, best


def close_checkpoints(checkpoints: Checkpoints, best: Sequence[Checkpoints]) -> None:
  for opened in [checkpoints, *(b for b in best if b is not checkpoints)]:
    opened.close()


def save_state(checkpoints: Checkpoints, step: int, state: TrainState, meta: dict) -> None:
  """Checkpoints `state` (without the seed axis for one seed) with `meta`."""
  one_seed = state.step.shape[0] == 1
  checkpoints.save_latest(step, take_seed(state, 0) if one_seed else state, meta)


def restore_state(
  checkpoints: Checkpoints, like: TrainState, mesh: Mesh | None
) -> tuple[TrainState, dict]:
  """The latest checkpoint's state, shaped and laid out as `like`, and its meta."""
  if like.step.shape[0] > 1:
    restored, meta = checkpoints.restore_latest(like)
    return place_state(restored, mesh, seed_axis=True), meta
  restored, meta = checkpoints.restore_latest(place_state(take_seed(like, 0), mesh))
  return place_state(stack([restored]), mesh, seed_axis=True), meta


def restore_or_init(
  config: ml_collections.ConfigDict,
  workdir: pathlib.Path,
  checkpoints: Checkpoints,
  model: RecurrentLM,
  optimizer: optax.GradientTransformation,
  mesh: Mesh | None,
  configs: Sequence[ml_collections.ConfigDict],
) -> tuple[TrainState, Progress, bool]:
  """The latest checkpoint's state and progress, or a new state of every
  seed of `configs` (from the best weights of `train.init_from`, when set,
  the same for every seed), laid out over `mesh`; and whether it resumed.
  Checkpoints restore straight into that layout: on many processes, arrays
  restored onto each one's devices could not be moved onto the others'."""
  if config.train.init_from and not checkpoints.has_latest():
    check_init_from(config.train.init_from)  # before the seconds each new state takes
  states = [create_train_state(model, optimizer, seeded) for seeded in configs]
  if checkpoints.has_latest():
    check_resumable(config, workdir, [c.seed for c in configs] if len(configs) > 1 else None)
    state, meta = restore_state(checkpoints, place_state(stack(states), mesh, True), mesh)
    return state, Progress(**meta), True
  if config.train.init_from:
    params = initial_params(config.train.init_from, states[0].params)
    states = [s.replace(params=params, opt_state=optimizer.init(params)) for s in states]
    log.info('Fine-tuning the best weights of %s', config.train.init_from)
  return place_state(stack(states), mesh, True), Progress.start(len(configs)), False
