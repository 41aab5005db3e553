"""Dynamic evaluation (Krause et al. 2018; MODELS.md section 7) as optax
gradient transformations, and the loop that scores a stream with it.

Dynamic evaluation adapts the weights to the text being scored: each segment
is scored with the current weights first, then the weights take a gradient
step on that segment. The transformations here map the segment's gradient to
that step; `dynamic_evaluate` runs the whole stream as one jitted `lax.scan`.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lm_zoo.data import BatchedStream
from lm_zoo.errors import TrainingError
from lm_zoo.training.evaluation import EvalResult
from lm_zoo.training.steps import token_nll

# What mean(MS) of the RMS decay rate is taken over (`dynamic_rms`).
DECAY_MEANS = ('coordinates', 'tensors')
log = logging.getLogger(__name__)


class DynamicEvalState(NamedTuple):
  """The trained weights theta_g that the update decays toward, and the
  per-coordinate scale s of that decay: the decay rate is lambda * s (SGD,
  s = 1) or min(1, lambda * s) (RMS, s = MS / mean(MS))."""
  trained: optax.Params
  decay_scale: optax.Updates


def dynamic_sgd(learning_rate: float, decay: float = 0.0) -> optax.GradientTransformation:
  """Dynamic evaluation by SGD, optionally decaying toward the trained weights:

    theta <- theta - eta * g + lambda * (theta_g - theta)

  Args:
    learning_rate: eta.
    decay: lambda; 0 is plain SGD (Krause et al. 2018, section 5).
  Returns:
    An `optax.GradientTransformation`; `update` needs `params`. Its state
    keeps theta_g, the parameters `init` is called with.
  """
  def init_fn(params):
    return DynamicEvalState(trained=params,
                            decay_scale=jax.tree.map(jnp.ones_like, params))

  def update_fn(grads, state, params):
    rates = jax.tree.map(lambda s: decay * s, state.decay_scale)
    return _step(grads, state, params, learning_rate, rates), state

  return optax.GradientTransformation(init_fn, update_fn)


def mean_ms(rms_gradients: optax.Updates, over: str = 'coordinates') -> jax.Array:
  """mean(MS) of the RMS decay rate: over every coordinate of the model
  ('coordinates', lamb's `dyneval.py`), or over the parameter tensors of each
  tensor's mean ('tensors', Krause's `dynamiceval.py`, where a tensor is a
  leaf of the tree)."""
  if over not in DECAY_MEANS:
    raise ValueError(f'the mean of the decay rate must be over one of {DECAY_MEANS}, '
                     f'got {over!r}')
  leaves = jax.tree.leaves(rms_gradients)
  if over == 'tensors':
    return sum(jnp.mean(x) for x in leaves) / len(leaves)
  return sum(jnp.sum(x) for x in leaves) / sum(x.size for x in leaves)


def dynamic_rms(learning_rate: float, decay: float, eps: float,
                rms_gradients: optax.Updates,
                decay_mean: str = 'coordinates') -> optax.GradientTransformation:
  """Dynamic evaluation with RMS-normalised steps and decay toward the
  trained weights (Krause et al. 2018; MODELS.md section 7):

    theta <- theta - eta * g / (MS + eps) + min(1, lambda * MS / mean(MS)) * (theta_g - theta)

  where MS is the root mean square of training gradients (`rms_gradients`,
  from `rms_training_gradients`): each coordinate decays at a rate that grows
  with its MS, clipped at 1 so that no step overshoots theta_g. mean(MS) is
  over every coordinate of the model with 'coordinates' (lamb's
  `dyneval.py`, `_make_update`) and over the parameter tensors of each
  tensor's mean with 'tensors' (Krause's `dynamiceval.py`); `mean_ms`.

  Args:
    learning_rate: eta.
    decay: lambda.
    eps: epsilon, added to MS.
    rms_gradients: MS, a tree like the parameters.
    decay_mean: 'coordinates' or 'tensors'.
  Returns:
    An `optax.GradientTransformation`; `update` needs `params`.
  """
  mean = mean_ms(rms_gradients, decay_mean)

  def init_fn(params):
    return DynamicEvalState(trained=params,
                            decay_scale=jax.tree.map(lambda ms: ms / mean, rms_gradients))

  def update_fn(grads, state, params):
    scaled = jax.tree.map(lambda g, ms: g / (ms + eps), grads, rms_gradients)
    rates = jax.tree.map(lambda s: jnp.minimum(1.0, decay * s), state.decay_scale)
    return _step(scaled, state, params, learning_rate, rates), state

  return optax.GradientTransformation(init_fn, update_fn)


def _step(direction, state: DynamicEvalState, params, learning_rate, decay_rates):
  if params is None:
    raise ValueError('dynamic evaluation decays toward the trained weights: pass '
                     'params to update')
  return jax.tree.map(lambda d, p, p0, r: -learning_rate * d + r * (p0 - p),
                      direction, params, state.trained, decay_rates)


def _segments(stream: np.ndarray, batch_size: int, segment_length: int):
  """The stream as (num_segments, batch, segment_length) inputs, targets and
  weights; the last segment padded with weight 0."""
  batched = BatchedStream(stream, batch_size)
  num_segments = -(-batched.row_length // segment_length)
  pad = num_segments * segment_length - batched.row_length

  def split(a):
    a = np.pad(a, ((0, 0), (0, pad)))
    return a.reshape(batch_size, num_segments, segment_length).transpose(1, 0, 2)

  return split(batched.inputs), split(batched.targets), split(batched.weights)


@functools.partial(jax.jit, static_argnames=('model', 'transformation'))
def _scan_segments(model, transformation, params, opt_state, carries, inputs, targets,
                   weights, extra_args):
  transformation = optax.with_extra_args_support(transformation)

  def segment_loss(p, carries, x, y, w):
    logits, carries = model.apply({'params': p}, x, carries)
    total, count = token_nll(logits, y, w)
    mean = total / jnp.maximum(count, 1.0)
    return mean, (mean, total, count, carries)

  def step(state, segment):
    params, opt_state, carries = state
    # One forward pass scores the segment with the current weights and gives
    # the gradient the weights then step along.
    grads, (loss, total, count, carries) = jax.grad(segment_loss, has_aux=True)(
        params, carries, *segment)
    updates, new_opt_state = transformation.update(
        grads, opt_state, params, loss=jax.lax.stop_gradient(loss), **extra_args)
    # A non-finite update (an overflowing gradient or step) is skipped: the
    # weights and the rule's state stay as they were.
    finite = jnp.isfinite(optax.tree.norm(updates))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    params = keep(optax.apply_updates(params, updates), params)
    opt_state = keep(new_opt_state, opt_state)
    return (params, opt_state, jax.lax.stop_gradient(carries)), (total, count, ~finite)

  state = (params, opt_state, carries)
  (params, _, _), (totals, counts, skipped) = jax.lax.scan(
      step, state, (inputs, targets, weights))
  return totals, counts, skipped, params


class DynamicEvalResult(NamedTuple):
  """The stream's score, each segment's NLL sum and token count, the
  weights after the last update, and how many updates were skipped for not
  being finite."""
  result: EvalResult
  segment_nll: np.ndarray
  segment_tokens: np.ndarray
  params: Any
  skipped_updates: int = 0


def dynamic_evaluate(model, params: Any, transformation: optax.GradientTransformation,
                     stream: np.ndarray, segment_length: int, batch_size: int = 1,
                     unit: str = 'word', max_loss: float | None = None,
                     extra_args: dict[str, Any] | None = None,
                     opt_state: Any = None) -> DynamicEvalResult:
  """Scores `stream` with dynamic evaluation, starting from `params`.

  The stream is laid out as `batch_size` rows (1 by default, as in the
  papers) and cut into segments of `segment_length` tokens; each segment is
  scored with the current weights, then `transformation` (for example
  `dynamic_sgd` or `dynamic_rms`, initialised here with `params` as the
  trained weights) updates them on that segment's mean NLL. The recurrent
  state carries across segments. One jitted `lax.scan` runs every segment.

  A transformation with extra arguments (`optax.GradientTransformationExtraArgs`,
  such as `learned_update_rule`) receives the segment's mean NLL as `loss`
  and `extra_args` (for example `{'meta_params': phi}`) at every update;
  `extra_args` are traced, so new values do not recompile.

  `opt_state` is the transformation's state to start from (default:
  `transformation.init(params)`). It is traced too: with one transformation
  object from `optax.inject_hyperparams`, a state holding other
  hyperparameters scores another setting without compiling again (a new
  transformation object compiles the scan anew, about 2 s on a CPU).

  An update that is not finite (for example an overflowing gradient) is
  skipped inside the scan, counted in `skipped_updates` and logged as a
  WARNING; the weights go on from where they were.

  Raises:
    TrainingError: the scores diverged: a segment's loss is not finite, or the
      stream's loss exceeds `max_loss` nats per token (default: twice the
      loss of a uniform guess, 2 log V). The Mogrifier paper lost runs to
      this; no number is returned.
  """
  if segment_length < 1:
    raise ValueError(f'segment_length must be at least 1, got {segment_length}')
  inputs, targets, weights = _segments(stream, batch_size, segment_length)
  opt_state = transformation.init(params) if opt_state is None else opt_state
  totals, counts, skipped, final = _scan_segments(
      model, transformation, params, opt_state, model.initialize_carry(batch_size), inputs,
      targets, weights, extra_args or {})
  totals, counts = np.asarray(totals, np.float64), np.asarray(counts, np.float64)
  skipped = int(np.sum(skipped))
  if skipped:
    log.warning('dynamic evaluation: %d of %d updates were not finite and were skipped',
                skipped, len(totals))
  bad = np.flatnonzero(~np.isfinite(totals))
  if bad.size:
    raise TrainingError(f'dynamic evaluation diverged: segment {bad[0]} of '
                        f'{len(totals)} has a non-finite loss; lower the learning rate')
  loss = totals.sum() / counts.sum()
  max_loss = 2 * math.log(model.vocab_size) if max_loss is None else max_loss
  if loss > max_loss:
    raise TrainingError(f'dynamic evaluation diverged: loss {loss:.3f} nats/token is '
                        f'above {max_loss:.3f}; lower the learning rate')
  return DynamicEvalResult(EvalResult(loss=float(loss), num_tokens=int(counts.sum()),
                                      unit=unit), totals, counts, final, skipped)


def rms_training_gradients(model, params: Any, stream: np.ndarray, batch_size: int,
                           bptt: int, num_batches: int) -> Any:
  """MS = sqrt(mean over `num_batches` training windows of g^2), per
  coordinate: the statistic `dynamic_rms` normalises by. Gradients are of the
  mean NLL of each window, with no clipping, no L2 and dropout off; the
  recurrent state carries across windows.
  """
  if num_batches < 1:
    raise ValueError(f'num_batches must be at least 1, got {num_batches}')

  @jax.jit
  def squared_gradients(params, carries, x, y, w):
    def loss(p):
      logits, carries_out = model.apply({'params': p}, x, carries)
      total, count = token_nll(logits, y, w)
      return total / jnp.maximum(count, 1.0), carries_out
    grads, carries = jax.grad(loss, has_aux=True)(params)
    return jax.tree.map(jnp.square, grads), jax.lax.stop_gradient(carries)

  sums = jax.tree.map(jnp.zeros_like, params)
  carries, seen = model.initialize_carry(batch_size), 0
  for window in BatchedStream(stream, batch_size).windows(bptt):
    if seen == num_batches:
      break
    squares, carries = squared_gradients(params, carries, window.inputs, window.targets,
                                         window.weights)
    sums = jax.tree.map(jnp.add, sums, squares)
    seen += 1
  return jax.tree.map(lambda s: jnp.sqrt(s / seen), sums)
