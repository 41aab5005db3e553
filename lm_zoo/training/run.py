"""What the training loop's phases (lm_zoo/training/loop.py) take: a `Trainer`,
the parts of a run fixed once it starts, and a `Run`, the state that changes
as it trains; also where training stands (`Progress`, with a list entry per
seed), and a run's first train state from its config."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Callable

import jax
import ml_collections

from lm_zoo.data import BatchedStream, Corpus
from lm_zoo.evaluation import EvalResult
from lm_zoo.models import RecurrentLM, init_params
from lm_zoo.progress import Throughput
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.runs.nonfinite import PendingUpdates
from lm_zoo.training.steps import TrainState

# on_validation(step, epoch, result): told each validation turn's result.
ValidationCallback = Callable[[int, int, EvalResult], None]


@dataclasses.dataclass
class Progress:
  """Where training stands, saved as JSON beside each checkpoint. The lists
  hold an entry per seed, in the seed axis' order (the defaults: one seed)."""

  epoch: int = 1
  position: int = 0  # time index within the epoch's rows of the next window
  valid_losses: list[list[float]] = dataclasses.field(default_factory=lambda: [[]])
  best_valid: list[float] = dataclasses.field(default_factory=lambda: [math.inf])
  # the update after which best_valid was scored
  best_step: list[int] = dataclasses.field(default_factory=lambda: [0])
  # dropped for a non-finite loss or gradient (train.nonfinite=skip)
  skipped_updates: list[int] = dataclasses.field(default_factory=lambda: [0])
  # the seed's rate lowered after one (train.nonfinite=rollback)
  rollbacks: list[int] = dataclasses.field(default_factory=lambda: [0])
  train_seconds: float = 0.0  # spent training up to this checkpoint (train.max_seconds)
  train_tokens: int = 0  # trained on up to this checkpoint, every seed's
  metrics_records: int = 0  # metrics.jsonl's records up to this checkpoint

  @classmethod
  def start(cls, num_seeds: int) -> Progress:
    """A new run's, for `num_seeds` seeds: no validation yet."""
    return cls(
      valid_losses=[[] for _ in range(num_seeds)],
      best_valid=[math.inf] * num_seeds,
      best_step=[0] * num_seeds,
      skipped_updates=[0] * num_seeds,
      rollbacks=[0] * num_seeds,
    )


@dataclasses.dataclass(frozen=True)
class Trainer:
  """What a run trains and scores with, fixed once it starts."""

  config: ml_collections.ConfigDict
  workdir: pathlib.Path
  configs: list[ml_collections.ConfigDict]  # each seed's (`seed_configs`)
  corpus: Corpus
  model: RecurrentLM
  mesh: jax.sharding.Mesh | None  # data parallel over it (None: one device)
  train_step: Callable  # make_train_step's, vmapped over the seeds
  eval_step: Callable  # make_eval_step's, compiled once for every split scored
  stacked_eval_step: Callable  # make_eval_step(stacked=True)'s: every seed validated at once
  batched: BatchedStream  # the training split in rows
  total_steps: int  # planned for the whole run (loop.planned_steps)
  checkpoints: Checkpoints  # WORKDIR/checkpoints: the latest states of every seed
  best: list[Checkpoints]  # each seed's best weights: WORKDIR/best, or WORKDIR/seed_S/best
  metrics: MetricsWriter
  on_validation: ValidationCallback | None
  started: float  # perf_counter() when this process began the run (wall_seconds)

  @property
  def num_seeds(self) -> int:
    return len(self.configs)

  def seed_fields(self, k: int) -> dict[str, int]:
    """What names seed `k` in a metrics record: nothing for a run of one seed."""
    return {} if self.num_seeds == 1 else {'seed': self.configs[k].seed}


@dataclasses.dataclass
class Run:
  """The state of a run that the phases hand on and change."""

  state: TrainState  # every leaf with the seed axis first
  progress: Progress
  updates: PendingUpdates  # dispatched, not yet read back
  step: int  # the updates done, state.step on the host
  step_lr: tuple | None = None  # each seed's rate in opt_state, once this process set them
  tokens_trained: int = 0  # by this process, every seed's
  throughput: Throughput = dataclasses.field(default_factory=Throughput)
  trained_before: float = 0.0  # seconds, by the processes this one resumes
  tokens_before: int = 0  # by the processes this one resumes
  train_start: float = dataclasses.field(default_factory=time.perf_counter)

  def seconds_trained(self) -> float:
    """The whole run's training time: this process's and the ones it resumes."""
    return self.trained_before + time.perf_counter() - self.train_start

  def all_tokens_trained(self) -> int:
    """The whole run's tokens trained on: this process's and the ones it resumes."""
    return self.tokens_before + self.tokens_trained


def create_train_state(model: RecurrentLM, optimizer, config) -> TrainState:
  """The first train state of seed `config.seed`, without the seed axis."""
  key = jax.random.key(config.seed)
  params = init_params(model, key, config.model.init, config.model.init_scale)
  return TrainState(
    step=jax.numpy.zeros((), jax.numpy.int32),
    params=params,
    opt_state=optimizer.init(params),
    carries=model.initialize_carry(config.data.batch_size),
    rng=jax.random.key_data(jax.random.fold_in(key, 1)),
  )
