"""Dynamic evaluation of a token stream (Krause et al. 2018; docs/models.md
§7): each segment is scored with the current weights, then an optax
transformation (`lm_zoo.optim.dynamic_sgd`, `dynamic_rms`,
`learned_update_rule`) updates them on that segment. One jitted `lax.scan`
runs the whole stream."""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend import core as jax_core

from lm_zoo.data import BatchedStream
from lm_zoo.errors import TrainingError, is_whole_number
from lm_zoo.evaluation.results import EvalResult
from lm_zoo.models.objective import check_token_ids, window_loss
from lm_zoo.progress import eta

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
    # Constants are values the program holds, which its text does not show:
    # another's would differ.
    self.program = None if _holds_constants(traced) else str(traced.jaxpr)

  def __eq__(self, other):
    if self.program is None or not isinstance(other, _Rule):
      return self is other
    return self.program == other.program

  def __hash__(self):
    return id(self) if self.program is None else hash(self.program)


def _holds_constants(closed) -> bool:
  """Whether a closed jaxpr, or one nested in its equations (a jitted
  function's, a branch's, a loop body's), holds constants."""
  pending = [closed]
  while pending:
    jaxpr = pending.pop()
    if isinstance(jaxpr, jax_core.ClosedJaxpr):
      if jaxpr.consts:
        return True
      jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
      for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(item, (jax_core.ClosedJaxpr, jax_core.Jaxpr)):
            pending.append(item)
  return False


def _segment_scan(
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
    # A leaf the update left as it was stays itself: under vmap, one every
    # member shares (MS, the trained weights) keeps no copy per member.
    keep = lambda new, old: jax.tree.map(
      lambda n, o: o if n is o else jnp.where(finite, n, o), new, old
    )
    params = keep(optax.apply_updates(params, updates), params)
    opt_state = keep(new_opt_state, opt_state)
    return (params, opt_state, jax.lax.stop_gradient(carries)), (total, count, ~finite)

  state = (params, opt_state, carries)
  (params, _, _), (totals, counts, skipped) = jax.lax.scan(step, state, (inputs, targets, weights))
  return totals, counts, skipped, params


_scan_segments = jax.jit(_segment_scan, static_argnames=('model', 'rule'))


@functools.partial(jax.jit, static_argnames=('model', 'rule', 'treedef', 'mapped'))
def _scan_members(
  model, rule: _Rule, treedef, mapped, leaves, carries, inputs, targets, weights, extra_args
):
  """`_segment_scan` of several members at once: `leaves` are the flat
  (params, opt_state) leaves, stacked on a leading member axis where
  `mapped` says so and shared by every member elsewhere."""

  def member(*member_leaves):
    params, opt_state = jax.tree.unflatten(treedef, member_leaves)
    return _segment_scan(
      model, rule, params, opt_state, carries, inputs, targets, weights, extra_args
    )

  return jax.vmap(member, in_axes=[0 if stacked else None for stacked in mapped])(*leaves)


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
  outcome = dynamic_evaluate_many(
    model,
    [DynamicMember(params, transformation, opt_state)],
    stream,
    segment_length,
    batch_size,
    unit,
    max_loss,
    extra_args,
  )[0]
  if isinstance(outcome, TrainingError):
    raise outcome
  return outcome


class DynamicMember(NamedTuple):
  """One dynamic evaluation among several of the same stream
  (`dynamic_evaluate_many`): the weights it starts from, its
  transformation, and that transformation's state to start from (None:
  `transformation.init(params)`)."""

  params: Any
  transformation: optax.GradientTransformation
  opt_state: Any = None


def dynamic_evaluate_many(
  model,
  members: Sequence[DynamicMember],
  stream: np.ndarray,
  segment_length: int,
  batch_size: int = 1,
  unit: str = 'word',
  max_loss: float | None = None,
  extra_args: dict[str, Any] | None = None,
  max_members: int = 0,
) -> list[DynamicEvalResult | TrainingError]:
  """`dynamic_evaluate` of one stream from several starts at once: the
  settings of a search, the seeds of a study.

  Members whose transformations update by the same program (those of
  `optax.inject_hyperparams` with other values in their states, each seed's
  `dynamic_rms`; see `dynamic_evaluate`) run as one compiled scan vmapped
  over them, at most `max_members` at a time (0: all). At batch 1 one
  member leaves a GPU idle between small kernels, so n members take far
  less than n times as long. A leaf that is the same in every member (the
  same array or equal values: weights every setting starts from, the shared
  MS and trained weights) is passed and carried once; the others are
  stacked, so memory grows with the members.

  Returns, in the order of `members`, each one's `DynamicEvalResult`, or
  the `TrainingError` `dynamic_evaluate` would raise for it (one member
  diverging does not stop the others).

  Example, two learning rates of SGD in one scan (held in the state, so
  that both are one program)::

    sgd = optax.inject_hyperparams(dynamic_sgd)
    members = [DynamicMember(params, sgd(learning_rate=eta)) for eta in (0.01, 0.1)]
    runs = dynamic_evaluate_many(model, members, stream, segment_length=5)
  """
  if not members:
    raise ValueError('members is empty: give at least one DynamicMember')
  if not is_whole_number(max_members) or max_members < 0:
    raise ValueError(
      f'max_members must be a whole number >= 0 (0: all at once), got {max_members!r}'
    )
  inputs, targets, weights = _segments(stream, batch_size, segment_length, model.vocab_size)
  extra_args = extra_args or {}
  carries = model.initialize_carry(batch_size)
  max_loss = 2 * math.log(model.vocab_size) if max_loss is None else max_loss
  starts = []
  for params, transformation, opt_state in members:
    opt_state = transformation.init(params) if opt_state is None else opt_state
    transformation = optax.with_extra_args_support(transformation)
    starts.append((params, opt_state, _Rule(transformation, params, opt_state, extra_args)))
  groups = _groups([rule for _, _, rule in starts], max_members or len(members))
  scan_inputs = (carries, inputs, targets, weights, extra_args)
  return _scored_groups(model, starts, groups, scan_inputs, unit, max_loss)


def _scored_groups(model, starts, groups, scan_inputs, unit: str, max_loss: float) -> list:
  """Each start's checked result (or TrainingError), group by group."""
  outcomes = [None] * len(starts)
  began, done = time.perf_counter(), 0
  for group in groups:
    scanned = _scan_group(model, [starts[i] for i in group], *scan_inputs)
    for i, (totals, counts, skipped, params) in zip(group, scanned):
      try:
        outcomes[i] = _checked_result(totals, counts, skipped, params, unit, max_loss)
      except TrainingError as err:
        outcomes[i] = err
    done += len(group)
    if len(groups) > 1:
      seconds = time.perf_counter() - began
      log.info(
        'dynamic evaluation: %d of %d scored, ETA %s',
        done,
        len(starts),
        eta(seconds, done, len(starts)),
      )
  return outcomes


def _groups(rules: list[_Rule], size: int) -> list[list[int]]:
  """The members' indices in groups of equal rules, at most `size` each."""
  by_rule: dict[_Rule, list[int]] = {}
  for i, rule in enumerate(rules):
    by_rule.setdefault(rule, []).append(i)
  return [ids[k : k + size] for ids in by_rule.values() for k in range(0, len(ids), size)]


def _same(leaf, first) -> bool:
  """Whether a member's leaf is the first member's: the same array, or one
  of the same shape, dtype and values (a transformation's `init` copies what
  it keeps, theta_g and MS, so that a step may donate its state)."""
  if leaf is first:
    return True
  if jnp.shape(leaf) != jnp.shape(first) or jnp.result_type(leaf) != jnp.result_type(first):
    return False
  return bool(jnp.array_equal(leaf, first))


def _scan_group(model, starts, carries, inputs, targets, weights, extra_args) -> list[tuple]:
  """Each start's (totals, counts, skipped, params) from one scan."""
  rule = starts[0][2]
  trees = [(params, opt_state) for params, opt_state, _ in starts]
  flat = [jax.tree.flatten(tree) for tree in trees]
  treedef = flat[0][1]
  columns = list(zip(*(leaves for leaves, _ in flat)))
  mapped = tuple(not all(_same(leaf, column[0]) for leaf in column) for column in columns)
  if not any(mapped):  # the same start every time: one scan serves all
    params, opt_state = trees[0]
    scanned = _scan_segments(
      model, rule, params, opt_state, carries, inputs, targets, weights, extra_args
    )
    return [scanned] * len(starts)
  leaves = [jnp.stack(column) if stacked else column[0] for column, stacked in zip(columns, mapped)]
  totals, counts, skipped, params = _scan_members(
    model, rule, treedef, mapped, leaves, carries, inputs, targets, weights, extra_args
  )
  return [
    (totals[i], counts[i], skipped[i], jax.tree.map(lambda leaf: leaf[i], params))
    for i in range(len(starts))
  ]


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
