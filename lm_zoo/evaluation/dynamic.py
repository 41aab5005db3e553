"""Dynamic evaluation of a token stream (Krause et al. 2018; docs/models.md
§7): each segment is scored with the current weights, then an optax
transformation (`lm_zoo.optim.dynamic_sgd`, `dynamic_rms`,
`learned_update_rule`) updates them on that segment. One jitted `lax.scan`
runs the whole stream."""

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
from lm_zoo.evaluation.results import EvalResult
from lm_zoo.models.objective import check_token_ids, window_loss

log = logging.getLogger(__name__)


def _segments(stream: np.ndarray, batch_size: int, segment_length: int, vocab_size: int):
  """The stream as (num_segments, batch, segment_length) inputs, targets and
  weights; the last segment padded with weight 0. Raises ValueError for a
  segment length under 1 or a token id past the vocabulary."""
  if segment_length < 1:
    raise ValueError(f'segment_length must be at least 1, got {segment_length}')
  check_token_ids(stream, vocab_size)
  batched = BatchedStream(stream, batch_size)
  num_segments = -(-batched.row_length // segment_length)
  pad = num_segments * segment_length - batched.row_length

  def split(a):
    a = np.pad(a, ((0, 0), (0, pad)))
    return a.reshape(batch_size, num_segments, segment_length).transpose(1, 0, 2)

  return split(batched.inputs), split(batched.targets), split(batched.weights)


class _Rule:
  """A transformation as `_scan_segments`' static argument: equal to another
  whose update traces to the same program with no constant, so that one
  compiled scan serves both (the RMS rule of each seed, whose MS lives in its
  state, say); else equal only to itself."""

  def __init__(
    self,
    transformation: optax.GradientTransformationExtraArgs,
    params,
    opt_state,
    extra_args: dict[str, Any],
  ):
    self.transformation = transformation
    update = lambda grads, state, params, loss, extra: transformation.update(
      grads, state, params, loss=loss, **extra
    )
    traced = jax.make_jaxpr(update)(params, opt_state, params, jnp.float32(0), extra_args)
    # Constants are values the program holds: another's would differ.
    self.program = None if traced.consts else str(traced.jaxpr)

  def __eq__(self, other):
    if self.program is None or not isinstance(other, _Rule):
      return self is other
    return self.program == other.program

  def __hash__(self):
    return id(self) if self.program is None else hash(self.program)


@functools.partial(jax.jit, static_argnames=('model', 'rule'))
def _scan_segments(
  model, rule: _Rule, params, opt_state, carries, inputs, targets, weights, extra_args
):
  transformation = rule.transformation
  value_and_grad = jax.value_and_grad(window_loss, argnums=1, has_aux=True)

  def step(state, segment):
    params, opt_state, carries = state
    # One forward pass scores the segment with the current weights and gives
    # the gradient the weights then step along.
    (loss, (total, count, carries)), grads = value_and_grad(model, params, carries, *segment)
    updates, new_opt_state = transformation.update(
      grads, opt_state, params, loss=jax.lax.stop_gradient(loss), **extra_args
    )
    # A non-finite update (an overflowing gradient or step) is skipped: the
    # weights and the rule's state stay as they were.
    finite = jnp.isfinite(optax.tree.norm(updates))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    params = keep(optax.apply_updates(params, updates), params)
    opt_state = keep(new_opt_state, opt_state)
    return (params, opt_state, jax.lax.stop_gradient(carries)), (total, count, ~finite)

  state = (params, opt_state, carries)
  (params, _, _), (totals, counts, skipped) = jax.lax.scan(step, state, (inputs, targets, weights))
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


def dynamic_evaluate(
  model,
  params: Any,
  transformation: optax.GradientTransformation,
  stream: np.ndarray,
  segment_length: int,
  batch_size: int = 1,
  unit: str = 'word',
  max_loss: float | None = None,
  extra_args: dict[str, Any] | None = None,
  opt_state: Any = None,
) -> DynamicEvalResult:
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
  `transformation.init(params)`). It is traced too: with a transformation
  from `optax.inject_hyperparams`, a state holding other hyperparameters
  scores another setting without compiling again. So does another
  transformation whose update is the same program, holding no array of its
  own (each seed's `dynamic_rms`: its MS is in its state); one that closes
  over arrays compiles the scan anew.

  An update that is not finite (for example an overflowing gradient) is
  skipped inside the scan, counted in `skipped_updates` and logged as a
  WARNING; the weights go on from where they were.

  Raises:
    TrainingError: the scores diverged: a segment's loss is not finite, or the
      stream's loss exceeds `max_loss` nats per token (default: twice the
      loss of a uniform guess, 2 log V). The Mogrifier paper lost runs to
      this; no number is returned.
  """
  inputs, targets, weights = _segments(stream, batch_size, segment_length, model.vocab_size)
  opt_state = transformation.init(params) if opt_state is None else opt_state
  transformation = optax.with_extra_args_support(transformation)
  extra_args = extra_args or {}
  rule = _Rule(transformation, params, opt_state, extra_args)
  carries = model.initialize_carry(batch_size)
  scanned = _scan_segments(
    model, rule, params, opt_state, carries, inputs, targets, weights, extra_args
  )
  max_loss = 2 * math.log(model.vocab_size) if max_loss is None else max_loss
  return _checked_result(*scanned, unit, max_loss)


def _checked_result(
  totals, counts, skipped, params, unit: str, max_loss: float
) -> DynamicEvalResult:
  """The `DynamicEvalResult` of `_scan_segments`' outputs: each segment's
  summed NLL, token count and whether its update was skipped, and the final
  `params`. Raises TrainingError where dynamic evaluation diverged or every
  update was skipped, and warns where some were."""
  totals, counts = np.asarray(totals, np.float64), np.asarray(counts, np.float64)
  skipped = int(np.sum(skipped))
  if skipped == len(totals):
    raise TrainingError(
      f'dynamic evaluation: every one of the {skipped} updates was not '
      'finite and was skipped, so the score would be the static one; '
      'lower the learning rate'
    )
  if skipped:
    log.warning(
      'dynamic evaluation: %d of %d updates were not finite and were skipped', skipped, len(totals)
    )
  bad = np.flatnonzero(~np.isfinite(totals))
  if bad.size:
    raise TrainingError(
      f'dynamic evaluation diverged: segment {bad[0]} of '
      f'{len(totals)} has a non-finite loss; lower the learning rate'
    )
  loss = totals.sum() / counts.sum()
  if loss > max_loss:
    raise TrainingError(
      f'dynamic evaluation diverged: loss {loss:.3f} nats/token is '
      f'above {max_loss:.3f}; lower the learning rate'
    )
  result = EvalResult(loss=float(loss), num_tokens=int(counts.sum()), unit=unit)
  return DynamicEvalResult(result, totals, counts, params, skipped)
