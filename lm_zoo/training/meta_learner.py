"""A meta-learned update rule stored in a work directory
(WORKDIR/meta_learner): its meta-parameters, theta_0's precision and the
description of the gate network it was trained as."""

from __future__ import annotations

import pathlib
from typing import Any

from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import MetaLearner
from lm_zoo.optim import GateNetwork, RMSGateNetwork, decay_logits, learned_update_rule
from lm_zoo.runs.checkpoints import restore_tree, save_tree

META_LEARNER_DIR = 'meta_learner'
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
