"""`train_seeds(config, workdir, num_seeds)`: one config trained with several
seeds at once.

At its paper's batch (Zaremba's 20 rows) a recurrent model's update is a
chain of small kernels that wait on one another and leave most of a GPU's
arithmetic unused. Here the train states of seeds config.seed, ...,
config.seed + N - 1 are stacked on a leading axis and the train step is
vmapped over it (`make_train_step(stacked=True)`), so that the N runs share
each kernel: faster per seed on a GPU, slower on a CPU, where the matrix
products are the cost (`benchmarks/stacked_seeds.py` measures both).

Seed s's run is the run `train_and_evaluate` trains with `config.seed = s`:
the same initial weights, dropout masks, windows and learning rates (the
schedule follows that seed's own validation history), equal up to rounding
(tests/test_stacked.py). Every epoch ends with each run validated and its
best weights kept in WORKDIR/seed_S, a work directory that `lm-zoo-eval`,
`lm-zoo-generate` and `lm_zoo.load` read (its metrics are in the stack's
WORKDIR/metrics.jsonl, each record with its `seed`). The stacked state is
checkpointed in WORKDIR/checkpoints every `train.checkpoint_every` updates,
at each epoch's end and on SIGTERM or SIGINT: the same command resumes. The
end (lm_zoo/training/stacked_summary.py) scores each run's best weights,
samples the text its run alone would, and writes the summaries.

What a run alone can do and the stack cannot is refused before anything
starts (`check_seeds_config`): data parallelism and many hosts, variable
BPTT (each seed draws its own window lengths), validation inside an epoch,
parameter averaging, fine-tuning from a work directory, and skipping or
rolling back a non-finite update (the stack stops and names the seed).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import signal
import time
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from lm_zoo.data import BatchedStream, Corpus
from lm_zoo.errors import ConfigError, Preempted, TrainingError
from lm_zoo.evaluation import evaluate_stream_stacked, make_eval_step, split_names
from lm_zoo.models import build_model
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.training.config_checks import check_memory, validate_config
from lm_zoo.training.budget import budget_spent, completed_summary, planned_steps
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.training.optimizers import epoch_learning_rate, make_optimizer, set_learning_rate
from lm_zoo.training.parallel import place_state
from lm_zoo.runs.preemption import StopRequest
from lm_zoo.data import load_data
from lm_zoo.training.run import create_train_state
from lm_zoo.training.stacked_run import StackProgress, StackRun, seed_dir, stack, take_seed
from lm_zoo.training.stacked_summary import finish_stack, spread
from lm_zoo.training.steps import make_train_step
from lm_zoo.runs.workdir import (check_resumable, check_workdir, record_data, save_config,
                                 save_seeds, workdir_lock)

log = logging.getLogger(__name__)

# Fields the stack cannot honour: (field, the value it can, why not).
_ALONE_ONLY = (
    ('parallel.num_devices', 1, 'the stacked runs share one device'),
    ('data.variable_bptt', False, 'each seed draws its own window lengths'),
    ('train.eval_every', 0, 'the stack validates at the end of each epoch only'),
    ('averaging.trigger', 'none', "each seed's averaging would start at its own step"),
    ('train.init_from', '', 'the seeds would start from the same weights'),
    ('train.nonfinite', 'stop', "one seed's skip or rollback would hold up the others"),
)


def check_seeds_config(config: ml_collections.ConfigDict, num_seeds: int,
                       alone: str = 'lm-zoo-train without --seeds') -> None:
  """Raises ConfigError when `num_seeds` < 1 or `config` asks for what only a
  run alone does (this module's docstring); the error names `alone`, how the
  caller trains each seed alone instead."""
  if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 1:
    raise ConfigError(f'num_seeds must be a whole number of at least 1, got {num_seeds!r}')
  for field, value, why in _ALONE_ONLY:
    section, name = field.split('.')
    if config[section][name] != value:
      raise ConfigError(
          f'{field}={config[section][name]!r} cannot be trained with seeds stacked '
          f'({why}): set {field}={value!r}, or train each seed alone ({alone})')


def seed_configs(config: ml_collections.ConfigDict, num_seeds: int
                 ) -> list[ml_collections.ConfigDict]:
  """The configs of the stacked runs: `config` with seed config.seed + k."""
  configs = []
  for k in range(num_seeds):
    seeded = config.copy_and_resolve_references()
    seeded.seed = config.seed + k
    configs.append(seeded)
  return configs


def train_seeds(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                num_seeds: int, final_splits: Sequence[str] | None = None) -> dict[str, Any]:
  """Trains seeds config.seed, ..., config.seed + num_seeds - 1 of `config` at
  once and scores each run's best weights on `final_splits` (None: the
  config's `evaluation.splits`). Returns the summary also written to
  WORKDIR/summary.json; running it again resumes (or returns the summary of
  a finished stack).

  Raises:
    ConfigError: `num_seeds` or the config does not fit a stack
      (`check_seeds_config`), or the work directory holds another run.
    WorkdirInUse: another process is training in `workdir`.
    TrainingError: a seed's loss or gradient is not finite.
    Preempted: stopped by a signal, after saving a checkpoint.
  """
  validate_config(config)
  check_seeds_config(config, num_seeds)
  workdir = check_workdir(workdir)
  final_splits = split_names(config.evaluation.splits if final_splits is None
                             else final_splits)
  with workdir_lock(workdir):
    return _train_seeds(config, workdir, num_seeds, final_splits)


def _train_seeds(config: ml_collections.ConfigDict, workdir: pathlib.Path, num_seeds: int,
                 final_splits: Sequence[str]) -> dict[str, Any]:
  """`train_seeds` once the work directory is locked."""
  started = time.perf_counter()
  corpus = load_data(config)
  validate_config(config, corpus)
  check_memory(config, len(corpus.vocab), num_seeds)
  model = build_model(config.model, len(corpus.vocab))
  optimizer = make_optimizer(config.optimizer)
  train_step = make_train_step(
      model, optimizer, config.optimizer.loss_reduction == 'sum_over_time',
      config.optimizer.ar, config.optimizer.tar, drop_state=config.train.drop_state,
      stacked=True)
  configs = seed_configs(config, num_seeds)
  seeds = [c.seed for c in configs]
  state = place_state(stack([create_train_state(model, optimizer, c) for c in configs]), None)
  with Checkpoints(workdir) as checkpoints:
    resumed = checkpoints.has_latest()
    progress = StackProgress.start(num_seeds)
    if resumed:
      check_resumable(config, workdir, seeds)
      state, meta = checkpoints.restore_latest(state)
      progress = StackProgress(**meta)
      log.info('Resumed the stack from step %d (epoch %d, position %d) in %s',
               int(state.step[0]), progress.epoch, progress.position, workdir)
      summary = completed_summary(config, workdir, int(state.step[0]), progress)
      if summary is not None:
        return summary
    save_config(config, workdir)
    record_data(corpus, workdir)
    save_seeds(workdir, seeds)
    best = [_seed_workdir(seeded, corpus, workdir) for seeded in configs]
    step = int(state.step[0])
    metrics = MetricsWriter(workdir, keep=progress.metrics_records,
                            resume_step=step if resumed else None)
    try:
      metrics.hyperparameters(config)
      run = StackRun(config=config, workdir=workdir, configs=configs, corpus=corpus,
                     model=model, batched=BatchedStream(corpus.train, config.data.batch_size),
                     train_step=train_step, checkpoints=checkpoints, best=best,
                     metrics=metrics, state=state, progress=progress, step=step,
                     trained_before=progress.train_seconds)
      log.info('Training seeds %s at once: %s parameters each; train %s tokens',
               ', '.join(map(str, seeds)),
               f'{sum(x.size for x in jax.tree.leaves(take_seed(state.params, 0))):,}',
               f'{len(corpus.train):,}')
      _train(run)
      return finish_stack(run, final_splits, started)
    finally:
      for seed_checkpoints in best:
        seed_checkpoints.close()
      metrics.close()


def _seed_workdir(seeded: ml_collections.ConfigDict, corpus: Corpus,
                  workdir: pathlib.Path) -> Checkpoints:
  """Makes seed `seeded.seed`'s work directory (its config and data records)
  and returns the checkpoints its best weights go to."""
  folder = seed_dir(workdir, seeded.seed)
  folder.mkdir(parents=True, exist_ok=True)
  save_config(seeded, folder)
  record_data(corpus, folder)
  return Checkpoints(folder)


def _train(run: StackRun) -> None:
  """Trains every seed until the epochs or a budget run out."""
  cfg, data = run.config, run.config.data
  num_seeds = len(run.configs)
  total = planned_steps(cfg, run.batched)
  with StopRequest() as stop:
    while (run.progress.epoch <= cfg.train.num_epochs
           and not budget_spent(cfg, run.step, run.seconds_trained())):
      rates = np.asarray([epoch_learning_rate(cfg.schedule, cfg.optimizer.learning_rate,
                                              run.progress.epoch, losses)
                          for losses in run.progress.valid_losses], np.float32)
      run.state = run.state.replace(opt_state=set_learning_rate(run.state.opt_state, rates))
      if run.progress.position == 0:
        run.state = run.state.replace(carries=place_state(
            stack([run.model.initialize_carry(data.batch_size)] * num_seeds), None))
      for window in run.batched.windows(data.bptt, run.progress.position):
        run.state, step_metrics = run.train_step(run.state, window.inputs, window.targets,
                                                 window.weights)
        run.step += 1
        run.progress.position = window.start + window.length
        run.pending.append((run.step, step_metrics))
        run.throughput.add(window.inputs.size * num_seeds)
        run.progress.train_tokens += window.inputs.size * num_seeds
        stopping = budget_spent(cfg, run.step, run.seconds_trained())
        if run.step % cfg.train.log_every == 0:
          _log_training(run, rates, total)
        if cfg.train.checkpoint_every > 0 and run.step % cfg.train.checkpoint_every == 0:
          _save(run)
        signum = stop.requested(run.step)
        if signum is not None:
          _save(run)
          raise Preempted(
              f'{signal.Signals(signum).name} received: training stopped at step {run.step} '
              f'(epoch {run.progress.epoch}) with a checkpoint in {run.workdir}/checkpoints; '
              'run the same command to resume', signum)
        if stopping:
          break
      if run.progress.position >= run.batched.row_length:
        _end_epoch(run)
      _save(run)


def _read_back(run: StackRun) -> tuple[np.ndarray, np.ndarray]:
  """The losses and gradient norms of the updates since the last read, one
  row per update and a column per seed; at the first non-finite one, records
  it and raises TrainingError naming its seed."""
  if not run.pending:
    empty = np.zeros((0, len(run.configs)))
    return empty, empty
  steps = [step for step, _ in run.pending]
  fetched = jax.device_get([step_metrics for _, step_metrics in run.pending])
  run.pending = []
  finite = np.stack([step_metrics['finite'] for step_metrics in fetched])
  if not finite.all():
    row, column = np.argwhere(~finite)[0]
    seed, step = run.configs[column].seed, steps[row]
    run.metrics.write('nonfinite', step=step, epoch=run.progress.epoch, seed=seed,
                      action='stop')
    kept = (f'its latest checkpoint in {run.workdir}/checkpoints holds finite weights for '
            'every seed' if run.checkpoints.has_latest() else
            'no checkpoint was written before it')
    raise TrainingError(
        f'seed {seed}: non-finite loss or gradient at step {step}; the stack stops ({kept}). '
        'Train that seed alone with train.nonfinite=skip or rollback, or lower '
        'optimizer.learning_rate')
  return (np.stack([step_metrics['loss'] for step_metrics in fetched]),
          np.stack([step_metrics['grad_norm'] for step_metrics in fetched]))


def _log_training(run: StackRun, rates: np.ndarray, total: int) -> None:
  """Logs the seeds' mean loss since the last line, and records each seed's."""
  losses, grad_norms = _read_back(run)
  loss, norm = losses.mean(axis=0), grad_norms.mean(axis=0)
  rate = run.throughput.rate()
  log.info('epoch %d step %d/%d (%.0f%%)  loss %.4f (seeds %.4f to %.4f)  grad norm %.3g  '
           'lr %.4g  %.0f tokens/s (all seeds)  ETA %s', run.progress.epoch, run.step, total,
           100 * run.step / total, loss.mean(), loss.min(), loss.max(), norm.mean(),
           rates.mean(), rate, run.throughput.eta(total - run.step))
  for k, seeded in enumerate(run.configs):
    run.metrics.write('train', step=run.step, epoch=run.progress.epoch, seed=seeded.seed,
                      loss=float(loss[k]), perplexity=math.exp(min(float(loss[k]), 700.0)),
                      grad_norm=float(norm[k]), learning_rate=float(rates[k]),
                      tokens_per_second=rate)
  run.throughput.reset()


def _end_epoch(run: StackRun) -> None:
  """Validates every seed, keeps each one's best weights, moves on."""
  _read_back(run)  # validate finite weights only
  cfg, progress = run.config, run.progress
  batch_size = cfg.data.eval_batch_size
  results = evaluate_stream_stacked(
      make_eval_step(run.model, stacked=True), run.state.params,
      stack([run.model.initialize_carry(batch_size)] * len(run.configs)), run.corpus.valid,
      batch_size, cfg.data.bptt, run.corpus.unit, what='valid evaluation')
  for k, (seeded, result) in enumerate(zip(run.configs, results)):
    progress.valid_losses[k].append(result.loss)
    run.metrics.write('valid', step=run.step, epoch=progress.epoch, seed=seeded.seed,
                      **result.as_dict())
    if result.loss < progress.best_valid[k]:
      progress.best_valid[k], progress.best_epoch[k] = result.loss, progress.epoch
      run.best[k].save_best(run.step, take_seed(run.state.params, k),
                            {'epoch': progress.epoch, 'valid_loss': result.loss})
  log.info('epoch %d done: valid %s', progress.epoch, spread(results))
  progress.epoch += 1
  progress.position = 0
  run.throughput.reset()


def _save(run: StackRun) -> None:
  """Checkpoints the stack, once its updates are read back finite."""
  _read_back(run)
  run.progress.train_seconds = run.seconds_trained()
  run.progress.metrics_records = run.metrics.count
  run.checkpoints.save_latest(run.step, run.state, dataclasses.asdict(run.progress))
  run.throughput.reset()
