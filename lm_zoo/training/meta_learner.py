"""A meta-learned update rule stored in a work directory
(WORKDIR/meta_learner): its meta-parameters, theta_0's precision and the
description of the gate network it was trained as; and meta-training's
progress inside its folder (FOLDER/progress) while it runs, from which a
stopped meta-training resumes."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import jax
import numpy as np

from lm_zoo.errors import ConfigError, LMZooError
from lm_zoo.evaluation import MetaLearner, MetaTrainState
from lm_zoo.optim import GateNetwork, RMSGateNetwork, decay_logits, learned_update_rule
from lm_zoo.runs.checkpoints import restore_tree, save_tree

log = logging.getLogger(__name__)

META_LEARNER_DIR = 'meta_learner'
# The folder inside the rule's folder that meta-training keeps its progress in,
# and the version of its files (another is started afresh).
PROGRESS_DIR = 'progress'
PROGRESS_FORMAT = 1
# The hand-designed rule a fresh meta-learner starts as.
PRIORS = ('sgd', 'rms')


def gate_network(meta: dict[str, Any]):
  """The gate network a saved meta-learner's description names: the `prior`
  rule it started as, with its settings."""
  if meta['prior'] == 'rms':
    return RMSGateNetwork(
      learning_rate=meta['initial_learning_rate'],
      decay=meta['initial_decay'],
      eps=meta['initial_eps'],
      mean_ms=meta['mean_ms'],
      hidden=meta['hidden'],
    )
  return GateNetwork(
    hidden=meta['hidden'],
    learning_rate=meta['initial_learning_rate'],
    **decay_logits(meta['initial_decay']),
  )


def save_meta_learner(
  folder: str | pathlib.Path, meta_params: Any, precision: Any, meta: dict[str, Any]
) -> None:
  """Writes a meta-learner: its trees and `meta`, the description
  `gate_network` reads back (with its segment length and training record)."""
  save_tree(pathlib.Path(folder), {'meta_params': meta_params, 'precision': precision}, meta)


def load_meta_learner(folder: str | pathlib.Path) -> MetaLearner:
  """The learned rule saved in `folder` (WORKDIR/meta_learner)."""
  saved = restore_tree(pathlib.Path(folder))
  if saved is None:
    raise ConfigError(f'no meta-learner in {folder}: run lm-zoo-meta-train --workdir=WORKDIR first')
  tree, meta = saved
  return MetaLearner(
    learned_update_rule(gate_network(meta).apply, tree['precision']),
    tree['meta_params'],
    meta['segment_length'],
    meta['initial_learning_rate'],
  )


def progress_folder(output: str | pathlib.Path) -> pathlib.Path:
  """Where meta-training for the rule saved to `output` keeps its progress:
  inside that folder, beside the rule's own checkpoint."""
  return pathlib.Path(output) / PROGRESS_DIR


def save_progress(folder: pathlib.Path, state: MetaTrainState, digest: str) -> None:
  """Writes `state` (atomically), under the `digest` of what it depends on."""
  leaves = jax.tree.leaves(state[1:5])
  meta = {'format': PROGRESS_FORMAT, 'digest': digest, 'step': state.step}
  meta['losses'] = [float(loss) for loss in state.losses]
  save_tree(folder, {f'{i:06d}': leaf for i, leaf in enumerate(leaves)}, meta)


def load_progress(folder: pathlib.Path, like: MetaTrainState, digest: str) -> MetaTrainState | None:
  """The state `save_progress` kept in `folder` under `digest`, shaped as
  `like`; None where there is none, or it is another meta-training's or
  damaged (meta-training then starts afresh, and replaces it)."""
  try:
    saved = restore_tree(folder)
  except LMZooError as err:
    log.warning('%s cannot be read (%s): starting afresh', folder, err)
    return None
  if saved is None:
    return None
  tree, meta = saved
  likes = jax.tree.leaves(like[1:5])
  leaves = [tree[key] for key in sorted(tree)]
  if (meta.get('format'), meta.get('digest')) != (PROGRESS_FORMAT, digest):
    log.warning('%s holds another meta-training: starting afresh', folder)
    return None
  step, losses = meta.get('step'), meta.get('losses')
  shapes = lambda arrays: [(np.shape(a), np.result_type(a)) for a in arrays]
  if not (
    shapes(leaves) == shapes(likes)
    and isinstance(losses, list)
    and all(isinstance(x, (int, float)) for x in losses)
    and type(step) is int
    and step == len(losses)
  ):
    log.warning("%s does not hold this meta-training's state: starting afresh", folder)
    return None
  log.info('resuming meta-training from meta-step %d (%s)', step, folder)
  treedef = jax.tree.structure(like[1:5])
  return MetaTrainState(step, *jax.tree.unflatten(treedef, leaves), np.asarray(losses, np.float64))
