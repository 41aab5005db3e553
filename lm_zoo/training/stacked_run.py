"""What a stack of seeds trained at once (lm_zoo/training/stacked.py) trains
with and where it stands (`StackRun`, `StackProgress`), and the trees of its
runs stacked on a leading axis."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from lm_zoo.data import BatchedStream, Corpus
from lm_zoo.models import RecurrentLM
from lm_zoo.progress import Throughput
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.training.steps import TrainState


def seed_dir(workdir: pathlib.Path, seed: int) -> pathlib.Path:
  """The work directory of seed `seed`'s run inside the stack's."""
  return workdir / f'seed_{seed}'


def stack(trees: Sequence[Any]) -> Any:
  """`trees` stacked leaf by leaf on a new leading axis."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def take_seed(tree: Any, k: int) -> Any:
  """Run `k`'s slice of a stacked tree."""
  return jax.tree.map(lambda leaf: leaf[k], tree)


@dataclasses.dataclass
class StackProgress:
  """Where the stack stands, saved as JSON beside each checkpoint. The lists
  hold one entry per seed, in the stack's order; `epoch` and `train_seconds`
  mean what `Progress`'s do (`budget.completed_summary` reads them)."""

  epoch: int = 1
  position: int = 0  # time index within the epoch's rows of the next window
  valid_losses: list[list[float]] = dataclasses.field(default_factory=list)
  best_valid: list[float] = dataclasses.field(default_factory=list)
  best_epoch: list[int] = dataclasses.field(default_factory=list)
  train_seconds: float = 0.0
  train_tokens: int = 0  # every seed's tokens
  metrics_records: int = 0

  @classmethod
  def start(cls, num_seeds: int) -> StackProgress:
    """A new stack's: no validation yet."""
    return cls(valid_losses=[[] for _ in range(num_seeds)], best_valid=[math.inf] * num_seeds,
               best_epoch=[0] * num_seeds)


@dataclasses.dataclass
class StackRun:
  """What the stack trains and scores with, and where it stands."""

  config: ml_collections.ConfigDict
  workdir: pathlib.Path
  configs: list[ml_collections.ConfigDict]  # each seed's (`seed_configs`)
  corpus: Corpus
  model: RecurrentLM
  batched: BatchedStream  # the training split in rows
  train_step: Callable  # make_train_step(stacked=True)'s
  checkpoints: Checkpoints  # the stack's latest states
  best: list[Checkpoints]  # each seed's WORKDIR/seed_S/best
  metrics: MetricsWriter
  state: TrainState  # stacked
  progress: StackProgress
  step: int  # the updates done, on the host
  pending: list[tuple[int, dict]] = dataclasses.field(default_factory=list)  # not read back
  throughput: Throughput = dataclasses.field(default_factory=Throughput)
  trained_before: float = 0.0  # seconds, by the processes this one resumes
  train_start: float = dataclasses.field(default_factory=time.perf_counter)

  def seconds_trained(self) -> float:
    """The whole stack's training time: this process's and the ones it resumes."""
    return self.trained_before + time.perf_counter() - self.train_start
