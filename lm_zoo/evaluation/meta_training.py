"""Meta-training the learned weight-update rule (Wolf et al. 2018; docs/models.md
§8) along a training stream: truncated backpropagation through K
updates of `lm_zoo.optim.learned_update_rule`."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Iterator, NamedTuple

import jax
import numpy as np
import optax

from lm_zoo.errors import TrainingError
from lm_zoo.models.objective import window_loss
from lm_zoo.optim.learned_update import GateFn, LearnedUpdateState, learned_update_rule

log = logging.getLogger(__name__)


@dataclasses.dataclass
class MetaLearner:
  """A meta-trained update rule: its transformation (theta_0's precision
  inside), meta-parameters, the segment length it was trained for and the
  learning rate it started from."""

  transformation: optax.GradientTransformationExtraArgs
  meta_params: Any
  segment_length: int
  initial_learning_rate: float


def meta_loss(
  model,
  gate_fn: GateFn,
  meta_params: Any,
  params: Any,
  state: LearnedUpdateState,
  carries: Any,
  segments: tuple[jax.Array, ...],
  checkpoint: bool = True,
  first_order: bool = False,
):
  """The meta-training objective L_meta = sum_i L_i along a training stream.

  `segments` = (inputs, targets, weights), each (K, B, T): K mini-batches of
  the stream. Segment i is scored with theta_{i-1} (its loss L_i), then the
  learned rule (meta-parameters `meta_params`) updates the weights on it, so
  L_meta depends on phi through every update before it; the recurrent state
  carries across segments. Its gradient with respect to `meta_params` is
  truncated backpropagation through the K updates.

  Args:
    checkpoint: recompute each update's forward pass in the backward pass
      (`jax.checkpoint`) instead of storing its activations.
    first_order: treat the LM gradient and loss fed to the meta-learner as
      constants (Andrychowicz et al.'s simplification: no second derivatives).
  Returns:
    (L_meta, (theta_K, final carries, the K losses)).
  """
  rule = learned_update_rule(gate_fn, state.precision)

  value_and_grad = jax.value_and_grad(window_loss, argnums=1, has_aux=True)

  def step(carry, segment):
    theta, carries = carry
    (loss, (_, _, carries)), grads = value_and_grad(model, theta, carries, *segment)
    seen_grads, seen_loss = grads, loss
    if first_order:
      seen_grads, seen_loss = jax.lax.stop_gradient((grads, loss))
    updates, _ = rule.update(seen_grads, state, theta, meta_params=meta_params, loss=seen_loss)
    return (optax.apply_updates(theta, updates), carries), loss

  if checkpoint:
    step = jax.checkpoint(step)
  (theta, carries), losses = jax.lax.scan(step, (params, carries), segments)
  return losses.sum(), (theta, carries, losses)


def stream_windows(
  stream: np.ndarray, offsets: np.ndarray, num_updates: int, segment_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """K = `num_updates` consecutive mini-batches of M = `segment_length` tokens
  of `stream`, one row per offset: (inputs, targets, weights), each (K, B, M),
  row b reading stream[offsets[b] : offsets[b] + K M + 1]."""
  span = num_updates * segment_length
  if np.any(offsets < 0) or np.any(offsets + span + 1 > len(stream)):
    raise ValueError(
      f'windows of {span + 1} tokens at offsets {offsets} do not fit a stream of {len(stream)}'
    )
  index = offsets[None, :, None] + (
    np.arange(num_updates)[:, None, None] * segment_length
    + np.arange(segment_length)[None, None, :]
  )
  stream = np.asarray(stream, np.int32)
  return stream[index], stream[index + 1], np.ones(index.shape, np.float32)


class MetaTrainResult(NamedTuple):
  """The trained meta-parameters and, per meta-step, L_meta / K (nats)."""

  meta_params: Any
  losses: np.ndarray


class MetaTrainState(NamedTuple):
  """Where meta-training stands after `step` meta-steps: what `meta_train`
  continues from (`start`) and shows after each step (`after_step`).

  Attributes:
    step: meta-steps taken.
    meta_params: the meta-parameters.
    opt_state: the meta-optimizer's state.
    theta: the LM's weights where the rule left them (with `carry_over`).
    carries: the recurrent state it left (with `carry_over`).
    losses: L_meta / K of each step taken.
  """

  step: int
  meta_params: Any
  opt_state: Any
  theta: Any
  carries: Any
  losses: np.ndarray


def meta_train(
  model,
  gate_fn: GateFn,
  meta_params: Any,
  params: Any,
  precision: Any,
  stream: np.ndarray,
  meta_steps: int,
  num_updates: int = 40,
  segment_length: int = 5,
  batch_size: int = 4,
  optimizer: optax.GradientTransformation | None = None,
  seed: int = 0,
  first_order: bool = False,
  checkpoint: bool = True,
  log_every: int = 0,
  carry_over: bool = False,
  start: MetaTrainState | None = None,
  after_step: Callable[[MetaTrainState], None] | None = None,
) -> MetaTrainResult:
  """Meta-trains the learned rule's `meta_params` along a training stream.

  Each meta-step runs the rule through K = `num_updates` consecutive
  mini-batches of `segment_length` tokens at `batch_size` stream positions
  and steps `optimizer` (default: Adam 1e-3 after clipping the
  meta-gradient's global norm at 1) along the gradient of L_meta
  (`meta_loss`: truncated backpropagation through the K updates, with
  `jax.checkpoint` so memory holds one copy of the weights per update).

  Without `carry_over`, every meta-step starts from the trained weights
  `params` (theta_0, with `precision`) and a zero recurrent state at random
  stream positions, so the rule only ever sees its first K updates. With
  `carry_over`, the rows walk along the stream from evenly spaced positions
  and each meta-step starts where the last ended, from the weights and
  recurrent state it left: the rule meets weights it has moved through
  thousands of updates, as in evaluation, and pays for steps that drift or
  diverge there. Weights and positions go back to the start when a row
  reaches the next row's start.

  `after_step` sees the state after each meta-step (to save it, or to stop
  by raising); `start`, one it saw, continues as if nothing had stopped.

  Raises:
    TrainingError: L_meta is not finite.
  """
  optimizer = optimizer or optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
  state = learned_update_rule(gate_fn, precision).init(params)
  zero_carries = model.initialize_carry(batch_size)
  step = _meta_step(model, gate_fn, optimizer, num_updates, checkpoint, first_order)
  last = _last_start(len(stream), meta_steps, num_updates, segment_length, batch_size)
  span = num_updates * segment_length
  windows = list(_window_offsets(len(stream), last, meta_steps, span, batch_size, carry_over, seed))
  at = start or MetaTrainState(
    0, meta_params, optimizer.init(meta_params), params, zero_carries, []
  )
  segments_at = lambda offsets: stream_windows(stream, offsets, num_updates, segment_length)
  for at in _meta_steps(step, state, at, windows, params, zero_carries, segments_at, log_every):
    if after_step is not None:
      after_step(at)
  return MetaTrainResult(at.meta_params, np.asarray(at.losses))


def _meta_steps(
  step: Callable,
  state: LearnedUpdateState,
  at: MetaTrainState,
  windows: list[tuple[np.ndarray, bool]],
  params: Any,
  zero_carries: Any,
  segments_at: Callable,
  log_every: int,
) -> Iterator[MetaTrainState]:
  """The state after each meta-step from `at` on, along `windows` (each
  step's stream offsets, and whether it starts afresh from `params`)."""
  meta_params, opt_state, theta, carries = at[1:5]
  losses = [float(loss) for loss in at.losses]
  for i, (offsets, afresh) in enumerate(windows[at.step :], at.step):
    if afresh:
      theta, carries = params, zero_carries
    meta_params, opt_state, theta, carries, loss = step(
      meta_params, opt_state, state, theta, carries, segments_at(offsets)
    )
    losses.append(float(loss))
    _check_and_log(i, len(windows), losses, log_every)
    yield MetaTrainState(i + 1, meta_params, opt_state, theta, carries, np.asarray(losses))


def _window_offsets(
  stream_length: int,
  last: int,
  meta_steps: int,
  span: int,
  batch_size: int,
  carry_over: bool,
  seed: int,
) -> Iterator[tuple[np.ndarray, bool]]:
  """Each meta-step's stream offsets, one per row, and whether it starts
  afresh (from the trained weights and a zero state): random offsets up to
  `last`, every one afresh; or with `carry_over`, rows that walk `span`
  tokens a step from evenly spaced starts, back to them (afresh) when a row
  would pass the next row's start."""
  rng = np.random.default_rng(seed)
  row_length = (stream_length - 1) // batch_size
  starts = np.arange(batch_size) * row_length
  offsets = starts
  for i in range(meta_steps):
    if not carry_over:
      yield rng.integers(0, last + 1, batch_size), True
      continue
    afresh = i == 0 or offsets[0] + span > row_length
    offsets = starts if afresh else offsets
    yield offsets, afresh
    offsets = offsets + span


def _check_and_log(i: int, meta_steps: int, losses: list[float], log_every: int) -> None:
  """Raises TrainingError where meta-step `i`'s L_meta / K (the last of
  `losses`) is not finite; logs the mean of the last `log_every` every
  `log_every` meta-steps (0: never)."""
  if not math.isfinite(losses[-1]):
    raise TrainingError(
      f'meta-training diverged at step {i}: L_meta is not finite; '
      'lower the meta learning rate or the initial UPDATE step'
    )
  if log_every and (i + 1) % log_every == 0:
    log.info(
      'meta-step %d/%d: L_meta / K %.4f (mean of the last %d)',
      i + 1,
      meta_steps,
      np.mean(losses[-log_every:]),
      log_every,
    )


def _last_start(
  stream_length: int, meta_steps: int, num_updates: int, segment_length: int, batch_size: int
) -> int:
  """The last stream position a meta-step's window can start at; raises
  ValueError for sizes that leave none."""
  if num_updates < 1 or segment_length < 1 or batch_size < 1 or meta_steps < 0:
    raise ValueError(
      'num_updates, segment_length and batch_size must be positive and meta_steps non-negative'
    )
  last = stream_length - num_updates * segment_length - 1
  if last < 0:
    raise ValueError(
      f'a stream of {stream_length} tokens is shorter than one window of '
      f'{num_updates} x {segment_length} tokens'
    )
  return last


def _meta_step(
  model,
  gate_fn: GateFn,
  optimizer: optax.GradientTransformation,
  num_updates: int,
  checkpoint: bool,
  first_order: bool,
) -> Callable:
  """One jitted meta-step: L_meta through the K updates of a window, its
  gradient, and the optimizer's step on the meta-parameters."""

  @jax.jit
  def step(meta_params, opt_state, state, theta, carries, segments):
    def objective(m):
      return meta_loss(
        model,
        gate_fn,
        m,
        theta,
        state,
        carries,
        segments,
        checkpoint=checkpoint,
        first_order=first_order,
      )

    (loss, (theta, carries, _)), grads = jax.value_and_grad(objective, has_aux=True)(meta_params)
    updates, opt_state = optimizer.update(grads, opt_state, meta_params)
    return (
      optax.apply_updates(meta_params, updates),
      opt_state,
      theta,
      carries,
      loss / num_updates,
    )

  return step
