"""A meta-learned update rule stored in a work directory
(WORKDIR/meta_learner): its meta-parameters, theta_0's precision and the
description of the gate network it was trained as; and meta-training's
progress beside it (FOLDER.progress) while it runs, from which a stopped
meta-training resumes."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import jax
import numpy as np

from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import MetaLearner, MetaTrainState
from lm_zoo.optim import GateNetwork, RMSGateNetwork, decay_logits, learned_update_rule
from lm_zoo.runs.checkpoints import restore_tree, save_tree

log = logging.getLogger(__name__)

META_LEARNER_DIR = 'meta_learner'
# The version of meta-training's progress files; another is started afresh.
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
  """Where meta-training for the rule saved to `output` keeps its progress."""
  output = pathlib.Path(output)
  return output.with_name(output.name + '.progress')


def save_progress(folder: pathlib.Path, state: MetaTrainState, digest: str) -> None:
  """Writes `state` (atomically), under the `digest` of what it depends on."""
  leaves = jax.tree.leaves(state[1:5])
  meta = {'format': PROGRESS_FORMAT, 'digest': digest, 'step': state.step}
  meta['losses'] = [float(loss) for loss in state.losses]
  save_tree(folder, {f'{i:06d}': leaf for i, leaf in enumerate(leaves)}, meta)


def load_progress(folder: pathlib.Path, like: MetaTrainState, digest: str) -> MetaTrainState | None:
  """The state `save_progress` kept in `folder` under `digest`, shaped as
  `like`; None where there is none, or it is another meta-training's."""
  saved = restore_tree(folder)
  if saved is None:
    return None
  tree, meta = saved
  treedef = jax.tree.structure(like[1:5])
  leaves = [tree[key] for key in sorted(tree)]
  other = (meta.get('format'), meta.get('digest')) != (PROGRESS_FORMAT, digest)
  if other or len(leaves) != treedef.num_leaves:
    log.warning('%s holds another meta-training: starting afresh', folder)
    return None
  log.info('resuming meta-training from meta-step %d (%s)', meta['step'], folder)
  losses = np.asarray(meta['losses'], np.float64)
  return MetaTrainState(meta['step'], *jax.tree.unflatten(treedef, leaves), losses)
