"""Scoring a token stream with the state carried across windows: the jitted
evaluation step, whole splits, per-token losses and the softmax temperature
that minimises a loss."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lm_zoo.data import BatchedStream, Corpus
from lm_zoo.evaluation.results import EvalResult
from lm_zoo.models.objective import check_token_ids, window_loss
from lm_zoo.progress import ProgressLog


@functools.lru_cache(maxsize=16)
def make_eval_step(model: nn.Module, stacked: bool = False) -> Callable:
  """Returns jitted `eval_step(params, carries, inputs, targets, weights,
  temperature=1.0)` -> (nll sum, token count, new carries), with dropout off
  and the logits divided by the softmax temperature (a traced argument, so
  tuning it does not recompile). Equal models share one step, so every
  evaluation of a model compiles once per shape. With `stacked` the params
  and carries have a leading axis of runs (seeds trained at once,
  `lm_zoo.training.seed_axis`), the step is vmapped over it, and so are the
  sums it returns."""

  def eval_step(params, carries, inputs, targets, weights, temperature=1.0):
    _, (total, count, carries) = window_loss(
      model, params, carries, inputs, targets, weights, temperature, train=False
    )
    return total, count, carries

  if not stacked:
    return jax.jit(eval_step)
  per_run = jax.vmap(eval_step, in_axes=(0, 0, None, None, None, None))

  def stacked_eval_step(params, carries, inputs, targets, weights, temperature=1.0):
    return per_run(params, carries, inputs, targets, weights, temperature)

  return jax.jit(stacked_eval_step)


def evaluate_stream(
  eval_step: Callable,
  params: Any,
  initial_carries: Any,
  stream: np.ndarray,
  batch_size: int,
  bptt: int,
  unit: str = 'word',
  temperature: float = 1.0,
  what: str = 'evaluation',
) -> EvalResult:
  """Scores every token of `stream` once, the state carried across windows.

  `initial_carries` must be for `batch_size` rows (`model.initialize_carry`,
  or `mc_dropout_carries` for an MC-dropout step). Any batch size, 1
  included, scores exactly the same len(stream) - 1 tokens. `temperature`
  divides the logits. A pass longer than 30 s logs its progress as `what`.
  """
  total, count = _stream_sums(
    eval_step, params, initial_carries, stream, batch_size, bptt, temperature, what
  )
  return EvalResult(
    loss=float(total / count), num_tokens=int(count), unit=unit, temperature=float(temperature)
  )


def evaluate_stream_stacked(
  eval_step: Callable,
  params: Any,
  initial_carries: Any,
  stream: np.ndarray,
  batch_size: int,
  bptt: int,
  unit: str = 'word',
  what: str = 'evaluation',
  temperature: float = 1.0,
) -> list[EvalResult]:
  """`evaluate_stream` for runs stacked on a leading axis: `eval_step` is
  `make_eval_step(model, stacked=True)`'s, `params` have that axis, every
  run starts from `initial_carries` (one run's), and the result is one
  `EvalResult` per run, in its order."""
  runs = jax.tree.leaves(params)[0].shape[0]
  carries = jax.tree.map(lambda x: jnp.broadcast_to(x, (runs, *x.shape)), initial_carries)
  totals, counts = _stream_sums(
    eval_step, params, carries, stream, batch_size, bptt, temperature, what
  )
  return [
    EvalResult(
      loss=float(total / count), num_tokens=int(count), unit=unit, temperature=float(temperature)
    )
    for total, count in zip(totals, counts)
  ]


def _stream_sums(
  eval_step: Callable,
  params: Any,
  initial_carries: Any,
  stream: np.ndarray,
  batch_size: int,
  bptt: int,
  temperature: float,
  what: str,
):
  """The NLL summed over every token of `stream` once, and the tokens counted
  (arrays over the runs for a stacked `eval_step`)."""
  batched = BatchedStream(stream, batch_size)
  carries, sums = initial_carries, []
  progress = ProgressLog(what, batched.num_windows(bptt))
  for window in batched.windows(bptt, pad_last=True):  # one compiled shape
    nll, n, carries = eval_step(
      params, carries, window.inputs, window.targets, window.weights, temperature
    )
    sums.append((nll, n))  # fetched once at the end, so dispatch stays async
    progress.update(len(sums), nll)
  return np.asarray(jax.device_get(sums), np.float64).sum(axis=0)


def evaluate_split(
  model: nn.Module,
  params: Any,
  corpus: Corpus,
  split: str,
  batch_size: int,
  bptt: int,
  eval_step=None,
) -> EvalResult:
  """Perplexity / bits per character of one split, state carried throughout."""
  check_token_ids(corpus.split(split), model.vocab_size, f'the {split} split')
  eval_step = eval_step or make_eval_step(model)
  return evaluate_stream(
    eval_step,
    params,
    model.initialize_carry(batch_size),
    corpus.split(split),
    batch_size,
    bptt,
    corpus.unit,
    what=f'{split} evaluation',
  )


def token_losses(model, params: Any, ids: np.ndarray, bptt: int = 35) -> np.ndarray:
  """The NLL in nats of each token of `ids[1:]` given every token before it:
  one row, the recurrent state carried across windows of `bptt`, dropout off.

  Summed, it is `evaluate_stream`'s total at batch size 1; per token, it
  shows where two models differ along a text.
  """

  check_token_ids(ids, model.vocab_size, 'ids')

  @jax.jit
  def window_losses(params, carries, inputs, targets):
    logits, carries = model.apply({'params': params}, inputs, carries, train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets)[0], carries

  carries, losses = model.initialize_carry(1), []
  for window in BatchedStream(np.asarray(ids), 1).windows(bptt):
    nll, carries = window_losses(params, carries, window.inputs, window.targets)
    losses.append(nll)
  return np.concatenate(jax.device_get(losses)).astype(np.float64)


def tune_temperature(
  loss_at: Callable[[float], float], low: float = 0.5, high: float = 2.0, tolerance: float = 0.01
) -> float:
  """The softmax temperature in [low, high] that minimises `loss_at(T)`
  (the validation loss), by golden-section search on 1/T.

  The NLL of softmax(z / T) is convex in 1/T (a log-sum-exp minus a linear
  term), so the search cannot stop at a false minimum. It costs about
  log(range / tolerance) / log(1.618) evaluations: 11 for the defaults.
  """
  if not 0 < low < high:
    raise ValueError(f'need 0 < low < high, got low={low}, high={high}')
  ratio = (math.sqrt(5) - 1) / 2
  a, b = 1 / high, 1 / low  # bounds on beta = 1 / T
  c, d = b - ratio * (b - a), a + ratio * (b - a)
  loss_c, loss_d = loss_at(1 / c), loss_at(1 / d)
  while 1 / a - 1 / b > tolerance:
    if loss_c < loss_d:
      b, d, loss_d = d, c, loss_c
      c = b - ratio * (b - a)
      loss_c = loss_at(1 / c)
    else:
      a, c, loss_c = c, d, loss_d
      d = a + ratio * (b - a)
      loss_d = loss_at(1 / d)
  return 1 / c if loss_c < loss_d else 1 / d
