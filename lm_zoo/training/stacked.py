"""`train_seeds(config, workdir, num_seeds)`: one config trained with several
seeds at once.

A recurrent model at its paper's batch (Zaremba's 20 rows) leaves an
accelerator mostly idle: an update is a chain of small kernels that wait on
one another (WORKSPACE.md's H100 profile), and a kernel over N times the rows
takes about as long. Here the train states of seeds config.seed, ...,
config.seed + N - 1 are stacked on a leading axis and the train step is
vmapped over it (`make_train_step(seeds=True)`), so that N runs share each
kernel. On an H200, 8 seeds of Zaremba's medium model trained at 79k tokens/s
each, all 39 epochs of the 8 in 12 minutes (WORKSPACE.md). On a CPU, where
the matrix products are the cost, a stack is 7 to 15% slower per seed than
the runs one after another (benchmarks/stacked_seeds.py).

Seed s's run is the run `train_and_evaluate` trains with `config.seed = s`:
the same initial weights, dropout masks, windows and learning rates (the
schedule follows that seed's own validation history), equal up to rounding
(tests/test_stacked.py). Every epoch ends with each run validated and its best
weights kept in WORKDIR/seed_S, an ordinary work directory that
`lm-zoo-eval`, `lm-zoo-generate` and `lm_zoo.load` read. The stacked state
is checkpointed in WORKDIR/checkpoints every `train.checkpoint_every`
updates, at each epoch's end and on SIGTERM or SIGINT: the same command
resumes. At the end each run's best weights are scored on the final splits
by the config's evaluator, WORKDIR/seed_S/summary.json holds that run's
summary and WORKDIR/summary.json every seed's with their mean and standard
deviation. No text is sampled.

What a run alone can do and the stack cannot is refused before anything
starts (`check_seeds_config`): data parallelism, variable BPTT (each seed
draws its own window lengths), validation inside an epoch, parameter
averaging, fine-tuning from a work directory, and skipping or rolling back a
non-finite update (the stack stops and names the seed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import signal
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm_zoo.data import BatchedStream
from lm_zoo.errors import ConfigError, Preempted, TrainingError
from lm_zoo.evaluation import (EvalResult, evaluate_stream_seeds, make_eval_step,
                               split_names)
from lm_zoo.models import build_model, legacy_transposed
from lm_zoo.progress import Throughput
from lm_zoo.runtime import environment
from lm_zoo.training.checkpoints import Checkpoints, write_text_atomically
from lm_zoo.training.config_checks import validate_config
from lm_zoo.training.loop import budget_spent, planned_steps
from lm_zoo.training.metrics import MetricsWriter
from lm_zoo.training.optimizers import epoch_learning_rate, make_optimizer, set_learning_rate
from lm_zoo.training.preemption import StopRequest
from lm_zoo.training.run import create_train_state, load_data
from lm_zoo.training.scoring import eval_batch_size, final_batch_size, final_scores
from lm_zoo.training.steps import make_train_step
from lm_zoo.training.summary import run_summary
from lm_zoo.training.workdir import (check_resumable, record_data, save_config,
                                     workdir_lock)

log = logging.getLogger(__name__)

SEEDS_FILE = 'seeds.json'  # WORKDIR/seeds.json: the seeds the stack trains

# Fields the stack cannot honour: (field, value that it can, why not).
_ALONE_ONLY = (
    ('parallel.num_devices', 1, 'the stacked runs share one device'),
    ('data.variable_bptt', False, 'each seed draws its own window lengths'),
    ('train.eval_every', 0, 'the stack validates at the end of each epoch only'),
    ('averaging.trigger', 'none', "each seed's averaging would start at its own step"),
    ('train.init_from', '', 'the seeds would start from the same weights'),
    ('train.nonfinite', 'stop', "one seed's skip or rollback would hold up the others"),
)


def check_seeds_config(config: ml_collections.ConfigDict, num_seeds: int) -> None:
  """Raises ConfigError when `num_seeds` < 1 or `config` asks for what only a
  run alone does (this module's docstring)."""
  if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 1:
    raise ConfigError(f'num_seeds must be a whole number of at least 1, got {num_seeds!r}')
  for field, value, why in _ALONE_ONLY:
    section, name = field.split('.')
    if config[section][name] != value:
      raise ConfigError(
          f'{field}={config[section][name]!r} cannot be trained with seeds stacked '
          f'({why}): set {field}={value!r}, or train each seed alone (launch/train.py '
          'without --seeds)')


def seed_configs(config: ml_collections.ConfigDict, num_seeds: int
                 ) -> list[ml_collections.ConfigDict]:
  """The configs of the stacked runs: `config` with seed config.seed + k."""
  configs = []
  for k in range(num_seeds):
    seeded = config.copy_and_resolve_references()
    seeded.seed = config.seed + k
    configs.append(seeded)
  return configs


def seed_dir(workdir: pathlib.Path, seed: int) -> pathlib.Path:
  """The work directory of seed `seed`'s run inside the stack's."""
  return workdir / f'seed_{seed}'


def stack(trees: Sequence[Any]) -> Any:
  """`trees` stacked leaf by leaf on a new leading axis."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def unstack(tree: Any, k: int) -> Any:
  """Run `k`'s part of a stacked tree."""
  return jax.tree.map(lambda leaf: leaf[k], tree)


@dataclasses.dataclass
class SeedsProgress:
  """Where the stack stands, saved as JSON beside each checkpoint; the lists
  have one entry per seed, in the stack's order."""

  epoch: int = 1
  position: int = 0  # time index within the epoch's rows of the next window
  valid_losses: list[list[float]] = dataclasses.field(default_factory=list)
  best_valid: list[float] = dataclasses.field(default_factory=list)
  best_epoch: list[int] = dataclasses.field(default_factory=list)
  train_seconds: float = 0.0
  train_tokens: int = 0  # every seed's tokens
  metrics_records: int = 0

  @classmethod
  def start(cls, num_seeds: int) -> 'SeedsProgress':
    return cls(valid_losses=[[] for _ in range(num_seeds)], best_valid=[math.inf] * num_seeds,
               best_epoch=[0] * num_seeds)


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
  workdir = pathlib.Path(workdir)
  final_splits = split_names(config.evaluation.splits if final_splits is None
                             else final_splits)
  with workdir_lock(workdir):
    return _train_seeds(config, workdir, num_seeds, final_splits)


@dataclasses.dataclass
class _Stack:
  """What the stack trains and scores with, and where it stands."""

  config: ml_collections.ConfigDict
  workdir: pathlib.Path
  configs: list[ml_collections.ConfigDict]
  corpus: Any
  model: Any
  batched: BatchedStream
  train_step: Any
  checkpoints: Checkpoints
  best: list[Checkpoints]  # each seed's WORKDIR/seed_S/best
  metrics: MetricsWriter
  state: Any
  progress: SeedsProgress
  step: int
  pending: list = dataclasses.field(default_factory=list)  # metrics not yet read back
  throughput: Throughput = dataclasses.field(default_factory=Throughput)
  trained_before: float = 0.0
  train_start: float = dataclasses.field(default_factory=time.perf_counter)

  def seconds_trained(self) -> float:
    return self.trained_before + time.perf_counter() - self.train_start


def _train_seeds(config: ml_collections.ConfigDict, workdir: pathlib.Path, num_seeds: int,
                 final_splits: Sequence[str]) -> dict[str, Any]:
  started = time.perf_counter()
  corpus = load_data(config)
  validate_config(config, corpus)
  model = build_model(config.model, len(corpus.vocab))
  optimizer = make_optimizer(config.optimizer)
  train_step = make_train_step(
      model, optimizer, config.optimizer.loss_reduction == 'sum_over_time',
      config.optimizer.ar, config.optimizer.tar, drop_state=config.train.drop_state, seeds=True)
  configs = seed_configs(config, num_seeds)
  seeds = [c.seed for c in configs]
  state = stack([create_train_state(model, optimizer, c) for c in configs])
  with Checkpoints(workdir, legacy_transposed=legacy_transposed) as checkpoints:
    resumed = checkpoints.has_latest()
    if resumed:
      check_resumable(config, workdir)
      _check_same_seeds(workdir, seeds)
      state, meta = checkpoints.restore_latest(state)
      progress = SeedsProgress(**meta)
      log.info('Resumed the stack from step %d (epoch %d, position %d) in %s',
               int(state.step[0]), progress.epoch, progress.position, workdir)
    else:
      progress = SeedsProgress.start(num_seeds)
    step = int(state.step[0])
    summary = _completed_summary(config, workdir, progress, step) if resumed else None
    if summary is not None:
      return summary
    save_config(config, workdir)
    record_data(corpus, workdir)
    write_text_atomically(workdir / SEEDS_FILE, json.dumps({'seeds': seeds}))
    best = []
    for seeded in configs:
      folder = seed_dir(workdir, seeded.seed)
      folder.mkdir(parents=True, exist_ok=True)
      save_config(seeded, folder)
      record_data(corpus, folder)
      best.append(Checkpoints(folder, legacy_transposed=legacy_transposed))
    metrics = MetricsWriter(workdir, keep=progress.metrics_records,
                            resume_step=step if resumed else None)
    s = _Stack(config=config, workdir=workdir, configs=configs, corpus=corpus, model=model,
               batched=BatchedStream(corpus.train, config.data.batch_size),
               train_step=train_step, checkpoints=checkpoints, best=best, metrics=metrics,
               state=state, progress=progress, step=step,
               trained_before=progress.train_seconds)
    try:
      log.info('Training seeds %s at once: %s parameters each; train %s tokens',
               ', '.join(map(str, seeds)),
               f'{sum(x.size for x in jax.tree.leaves(unstack(state.params, 0))):,}',
               f'{len(corpus.train):,}')
      _train(s)
      return _finish(s, final_splits, started)
    finally:
      for folder_checkpoints in best:
        folder_checkpoints.close()
      metrics.close()


def _check_same_seeds(workdir: pathlib.Path, seeds: list[int]) -> None:
  path = workdir / SEEDS_FILE
  saved = json.loads(path.read_text())['seeds'] if path.is_file() else None
  if saved != seeds:
    raise ConfigError(
        f'{workdir} holds a {"run" if saved is None else f"stack of seeds {saved}"}, not '
        f'seeds {seeds}: resume it with its own --seeds and config.seed, or use a new '
        '--workdir')


def _completed_summary(config, workdir, progress, step) -> dict[str, Any] | None:
  """The summary of a stack that had finished at `step`, or None."""
  path = workdir / 'summary.json'
  done = (progress.epoch > config.train.num_epochs
          or budget_spent(config, step, progress.train_seconds))
  if not done or not path.is_file():
    return None
  summary = json.loads(path.read_text())
  if summary.get('step') != step:
    return None
  log.info('The stack in %s is already complete (%d steps); its summary is in %s',
           workdir, step, path)
  return summary


def _train(s: _Stack) -> None:
  """Trains every seed until the epochs or a budget run out."""
  cfg, data = s.config, s.config.data
  num_seeds = len(s.configs)
  total = planned_steps(cfg, s.batched)
  with StopRequest() as stop:
    while (s.progress.epoch <= cfg.train.num_epochs
           and not budget_spent(cfg, s.step, s.seconds_trained())):
      rates = np.asarray([epoch_learning_rate(cfg.schedule, cfg.optimizer.learning_rate,
                                              s.progress.epoch, losses)
                          for losses in s.progress.valid_losses], np.float32)
      s.state = s.state.replace(opt_state=set_learning_rate(s.state.opt_state, rates))
      if s.progress.position == 0:
        s.state = s.state.replace(carries=stack(
            [s.model.initialize_carry(data.batch_size)] * num_seeds))
      for window in s.batched.windows(data.bptt, s.progress.position):
        s.state, step_metrics = s.train_step(s.state, window.inputs, window.targets,
                                             window.weights)
        s.step += 1
        s.progress.position = window.start + window.length
        s.pending.append((s.step, step_metrics))
        s.throughput.add(window.inputs.size * num_seeds)
        s.progress.train_tokens += window.inputs.size * num_seeds
        stopping = budget_spent(cfg, s.step, s.seconds_trained())
        if s.step % cfg.train.log_every == 0:
          _log_training(s, rates, total)
        if cfg.train.checkpoint_every > 0 and s.step % cfg.train.checkpoint_every == 0:
          _save(s)
        signum = stop.requested(s.step)
        if signum is not None:
          _save(s)
          raise Preempted(
              f'{signal.Signals(signum).name} received: training stopped at step {s.step} (epoch '
              f'{s.progress.epoch}) with a checkpoint in {s.workdir}/checkpoints; run the '
              'same command to resume', signum)
        if stopping:
          break
      if s.progress.position >= s.batched.row_length:
        _end_epoch(s)
      _save(s)


def _read_back(s: _Stack) -> tuple[np.ndarray, np.ndarray]:
  """The losses and gradient norms of the updates since the last read, one
  row per update and a column per seed; raises TrainingError at the first
  non-finite one."""
  if not s.pending:
    empty = np.zeros((0, len(s.configs)))
    return empty, empty
  steps = [step for step, _ in s.pending]
  fetched = jax.device_get([m for _, m in s.pending])
  s.pending = []
  finite = np.stack([m['finite'] for m in fetched])
  if not finite.all():
    row, column = np.argwhere(~finite)[0]
    kept = (f'its latest checkpoint in {s.workdir}/checkpoints holds finite weights for '
            'every seed' if s.checkpoints.has_latest() else 'no checkpoint was written before it')
    raise TrainingError(
        f'seed {s.configs[column].seed}: non-finite loss or gradient at step {steps[row]}; '
        f'the stack stops ({kept}). Train that seed alone with train.nonfinite=skip or '
        'rollback, or lower optimizer.learning_rate')
  return (np.stack([m['loss'] for m in fetched]),
          np.stack([m['grad_norm'] for m in fetched]))


def _log_training(s: _Stack, rates: np.ndarray, total: int) -> None:
  losses, grad_norms = _read_back(s)
  loss, norm = losses.mean(axis=0), grad_norms.mean(axis=0)
  rate = s.throughput.rate()
  log.info('epoch %d step %d/%d (%.0f%%)  loss %.4f (seeds %.4f to %.4f)  grad norm %.3g  '
           'lr %.4g  %.0f tokens/s (all seeds)  ETA %s', s.progress.epoch, s.step, total,
           100 * s.step / total, loss.mean(), loss.min(), loss.max(), norm.mean(),
           rates.mean(), rate, s.throughput.eta(total - s.step))
  for k, seeded in enumerate(s.configs):
    s.metrics.write('train', step=s.step, epoch=s.progress.epoch, seed=seeded.seed,
                    loss=float(loss[k]), perplexity=math.exp(min(float(loss[k]), 700.0)),
                    grad_norm=float(norm[k]), learning_rate=float(rates[k]),
                    tokens_per_second=rate)
  s.throughput.reset()


def _end_epoch(s: _Stack) -> None:
  """Validates every seed, keeps each one's best weights, moves on."""
  _read_back(s)  # validate finite weights only
  cfg, progress = s.config, s.progress
  batch_size = eval_batch_size(cfg, 'valid')
  num_seeds = len(s.configs)
  results = evaluate_stream_seeds(
      make_eval_step(s.model, seeds=True), s.state.params,
      stack([s.model.initialize_carry(batch_size)] * num_seeds), s.corpus.valid, batch_size,
      cfg.data.bptt, s.corpus.unit, what='valid evaluation')
  for k, (seeded, result) in enumerate(zip(s.configs, results)):
    progress.valid_losses[k].append(result.loss)
    s.metrics.write('valid', step=s.step, epoch=progress.epoch, seed=seeded.seed,
                    **result.as_dict())
    if result.loss < progress.best_valid[k]:
      progress.best_valid[k], progress.best_epoch[k] = result.loss, progress.epoch
      s.best[k].save_best(s.step, unstack(s.state.params, k),
                          {'epoch': progress.epoch, 'valid_loss': result.loss})
  log.info('epoch %d done: valid %s', progress.epoch, _spread(results))
  progress.epoch += 1
  progress.position = 0
  s.throughput.reset()


def _save(s: _Stack) -> None:
  _read_back(s)  # never checkpoint non-finite weights
  s.progress.train_seconds = s.seconds_trained()
  s.progress.metrics_records = s.metrics.count
  s.checkpoints.save_latest(s.step, s.state, dataclasses.asdict(s.progress))
  s.throughput.reset()


def _spread(results: Sequence[EvalResult]) -> str:
  """'perplexity 86.52 ± 0.31 (seeds: 86.20, 86.84)': the mean and sample
  standard deviation over the seeds."""
  values = [r.perplexity if r.unit == 'word' else r.bits_per_token for r in results]
  name = 'perplexity' if results[0].unit == 'word' else 'bpc'
  std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
  return (f'{name} {np.mean(values):.2f} ± {std:.2f} (seeds: '
          f'{", ".join(f"{v:.2f}" for v in values)})')


def _finish(s: _Stack, final_splits: Sequence[str], started: float) -> dict[str, Any]:
  """Scores each seed's best weights and writes the summaries."""
  seconds = s.seconds_trained()
  tokens_per_second = round(s.progress.train_tokens / max(seconds, 1e-9), 1)
  runs = []
  for k, seeded in enumerate(s.configs):
    folder = seed_dir(s.workdir, seeded.seed)
    params = unstack(s.state.params, k)
    best = s.best[k].restore_best(params)
    params, best_meta = best if best is not None else (params, {'epoch': s.progress.epoch})
    run = {'seed': seeded.seed, 'step': s.step, 'best_epoch': best_meta['epoch'],
           'train_seconds': round(seconds, 1),
           'tokens_per_second': round(tokens_per_second / len(s.configs), 1),
           'num_params': int(sum(x.size for x in jax.tree.leaves(params))),
           'unit': s.corpus.unit, 'skipped_updates': 0, 'rollbacks': 0,
           'valid_curve': [_score(loss, s.corpus.unit) for loss in s.progress.valid_losses[k]],
           'environment': environment()}
    scores = final_scores(seeded, folder, s.model, s.corpus, params, final_splits)
    for split, result in scores.items():
      s.metrics.write(split, step=s.step, seed=seeded.seed, final=True, **result.as_dict())
      run[split] = result.as_dict()
    run['wall_seconds'] = round(time.perf_counter() - started, 1)
    write_text_atomically(folder / 'summary.json', json.dumps(run, indent=2))
    log.info('seed %d: %s', seeded.seed, run_summary(run, folder).replace('\n', ';'))
    runs.append(run)
  summary: dict[str, Any] = {
      'step': s.step, 'seeds': [c.seed for c in s.configs], 'train_seconds': round(seconds, 1),
      'tokens_per_second': tokens_per_second, 'num_params': runs[0]['num_params'],
      'unit': s.corpus.unit, 'runs': runs, 'environment': environment(),
      'wall_seconds': round(time.perf_counter() - started, 1)}
  for split in final_splits:
    results = [EvalResult(run[split]['loss'], run[split]['num_tokens'], s.corpus.unit)
               for run in runs]
    values = [_score(r.loss, s.corpus.unit) for r in results]
    summary[split] = {'mean': float(np.mean(values)),
                      'std': float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                      'measure': 'perplexity' if s.corpus.unit == 'word' else 'bpc'}
    log.info('%s over %d seeds: %s', split, len(runs), _spread(results))
  write_text_atomically(s.workdir / 'summary.json', json.dumps(summary, indent=2))
  return summary


def _score(loss: float, unit: str) -> float:
  """The figure a paper reports for a mean NLL `loss`: perplexity for
  words, bits per character otherwise."""
  result = EvalResult(loss, 0, unit)
  return result.perplexity if unit == 'word' else result.bits_per_token
