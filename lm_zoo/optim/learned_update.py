"""The meta-learned weight-update rule of the dynamical language model
(Wolf et al. 2018, eq. 3; docs/models.md §8) as an optax transformation.

A coordinate-wise meta-learner g_phi maps, for every weight, the tuple
(theta_{t-1}, L_t, grad_t, theta_0) to three gates and the rule

  theta_t = f_t * theta_{t-1} + i_t * grad_t + z_t * theta_0

COPYs the current weight, UPDATEs it along the gradient and FLUSHes it toward
the static long-term memory theta_0 (the trained weights, with their diagonal
Fisher information as precision: elastic weight consolidation).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lm_zoo.optim.dynamic_evaluation import mean_ms

# (meta-parameters, features (..., NUM_FEATURES)) -> gates (f, i, z), each (...).
GateFn = Callable[[Any, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]
NUM_FEATURES = 5
# Added to the precision before its log, so that a weight no gradient ever
# reached (precision 0) still has a finite feature.
PRECISION_FLOOR = 1e-12


class LearnedUpdateState(NamedTuple):
  """The static long-term memory: its mean theta_0 (the trained weights) and
  diagonal precision (the diagonal Fisher information)."""

  theta0: optax.Params
  precision: optax.Params


class GateNetwork(nn.Module):
  """g_phi: a feed-forward net applied to every coordinate alone, its
  parameters shared by all coordinates (Andrychowicz et al. 2016).

  It reads the features of `coordinate_features` and returns the COPY gate
  f = sigmoid(.), the UPDATE step i (unconstrained; negative descends) and
  the FLUSH gate z = sigmoid(.). The output layer starts at zero, so the
  initial rule is f = sigmoid(copy_logit), i = -learning_rate,
  z = sigmoid(flush_logit) everywhere: SGD with a slight pull to theta_0
  (`decay_logits` gives the logits of a pull at a chosen rate).

  Attributes:
    hidden: width of the hidden layer.
    learning_rate: the initial UPDATE step size.
    copy_logit, flush_logit: the initial gate logits.
  """

  hidden: int = 16
  learning_rate: float = 1e-3
  copy_logit: float = 5.0
  flush_logit: float = -5.0

  @nn.compact
  def __call__(self, features: jax.Array):
    out = _coordinatewise_mlp(
      self,
      [features[..., k] for k in range(features.shape[-1])],
      self.hidden,
      jnp.array([self.copy_logit, -self.learning_rate, self.flush_logit]),
    )
    return jax.nn.sigmoid(out[0]), out[1], jax.nn.sigmoid(out[2])


class RMSGateNetwork(nn.Module):
  """g_phi as a learned modulation of RMS dynamic evaluation (Krause et al.
  2018; docs/models.md §7): a fresh network is exactly
  `dynamic_rms(learning_rate, decay, eps, sqrt(precision))`, and
  meta-training reshapes it per coordinate.

  With ms = sqrt(precision + PRECISION_FLOOR) (the RMS training gradient,
  the square root of theta_0's diagonal Fisher), the step s = learning_rate / (ms + eps) and the
  decay rate r = min(1, decay * ms / mean_ms), the gates are

    i = -s exp(o_i),  f = 1 - min(1, r exp(o_f)),  z = min(1, r exp(o_z))

  where (o_f, o_i, o_z) is the output of a coordinate-wise net that starts
  at zero. Its inputs are the five features of `coordinate_features` in units
  that do not depend on the model's scale: g / (ms + eps), (theta - theta_0) / s,
  theta_0 / s, log(ms / mean_ms) and L_t, each but the log through
  sign(x) log(1 + |x|). The step keeps its sign (the rule always descends)
  and the decay stays in [0, 1].

  Attributes:
    learning_rate, decay, eps: the RMS rule it starts as (decay > 0).
    mean_ms: mean(MS) of that rule (`mean_rms`: over coordinates as lamb,
      or over tensors as Krause).
    hidden: width of the hidden layer.
  """

  learning_rate: float
  decay: float
  eps: float
  mean_ms: float
  hidden: int = 8

  @nn.compact
  def __call__(self, features: jax.Array):
    if not self.decay > 0:
      raise ValueError(f'the decay of RMSGateNetwork must be positive, got {self.decay}')
    moved, grad, theta0, log_precision, loss = (features[..., k] for k in range(NUM_FEATURES))
    ms = jnp.exp(0.5 * log_precision)
    step = self.learning_rate / (ms + self.eps)
    relative = ms / self.mean_ms
    rate = jnp.minimum(1.0, self.decay * relative)
    inputs = [
      _signed_log(grad / (ms + self.eps)),
      _signed_log(moved / step),
      _signed_log(theta0 / step),
      jnp.log(relative),
      _signed_log(loss),
    ]
    out = _coordinatewise_mlp(self, inputs, self.hidden, jnp.zeros(3))
    copy_decay = jnp.minimum(1.0, rate * jnp.exp(out[0]))
    flush = jnp.minimum(1.0, rate * jnp.exp(out[2]))
    return 1.0 - copy_decay, -step * jnp.exp(out[1]), flush


def _signed_log(x):
  # Features that span many orders of magnitude, squeezed to a range tanh reads.
  return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def _coordinatewise_mlp(
  module: nn.Module, inputs: list[jax.Array], hidden: int, output_bias: jax.Array
) -> list[jax.Array]:
  """A one-hidden-layer tanh net over per-coordinate `inputs` whose output
  layer starts at zero (the output is `output_bias`), declared in `module`.
  Written as sums of per-coordinate products rather than matrix products
  with an inner dimension of 5: XLA fuses the whole net into one pass over
  the coordinates instead of materialising (num_coordinates, hidden)."""
  hidden_kernel = module.param('hidden', nn.initializers.lecun_normal(), (len(inputs), hidden))
  hidden_bias = module.param('hidden_bias', nn.initializers.zeros_init(), (hidden,))
  gates_kernel = module.param('gates', nn.initializers.zeros_init(), (hidden, 3))
  gates_bias = module.param('gates_bias', lambda *_: output_bias)
  h = [
    jnp.tanh(sum(x * hidden_kernel[k, j] for k, x in enumerate(inputs)) + hidden_bias[j])
    for j in range(hidden)
  ]
  return [sum(h[j] * gates_kernel[j, m] for j in range(hidden)) + gates_bias[m] for m in range(3)]


def mean_rms(precision: optax.Params, over: str = 'coordinates') -> float:
  """mean_ms of `RMSGateNetwork`: `mean_ms` of its ms, sqrt(precision +
  PRECISION_FLOOR) (the RMS training gradient), over every coordinate or
  over the parameter tensors (`over`)."""
  return float(mean_ms(jax.tree.map(lambda p: jnp.sqrt(p + PRECISION_FLOOR), precision), over))


def decay_logits(decay: float) -> dict[str, float]:
  """`GateNetwork` fields whose initial rule decays toward theta_0 at `decay`
  per update: f = 1 - decay, z = decay (so f + z = 1)."""
  if not 0 < decay < 1:
    raise ValueError(f'the initial decay toward theta_0 must be in (0, 1), got {decay}')
  logit = math.log(decay / (1 - decay))
  return {'copy_logit': -logit, 'flush_logit': logit}


def coordinate_features(param, grad, theta0, precision, loss) -> jax.Array:
  """Per coordinate: (theta - theta_0, grad, theta_0, log precision, L_t),
  shape (..., NUM_FEATURES). The loss is broadcast to every coordinate."""
  return jnp.stack(
    [
      param - theta0,
      grad,
      theta0,
      jnp.log(precision + PRECISION_FLOOR),
      jnp.broadcast_to(loss, param.shape),
    ],
    axis=-1,
  )


def learned_update_rule(
  gate_fn: GateFn, precision: optax.Params | None = None
) -> optax.GradientTransformationExtraArgs:
  """The learned rule of eq. (3) as an optax transformation.

  `init(params)` stores theta_0 = params (the trained weights) with
  `precision`, copies, so that a jitted step may donate the parameters and
  the state. `update(grads, state, params, meta_params=..., loss=...)`
  returns theta_t - theta_{t-1}, so `optax.apply_updates` gives theta_t; the
  meta-parameters and the loss L_t (a feature of the rule, so required)
  arrive as extra arguments, which `optax.chain` passes through.

  Args:
    gate_fn: (meta_params, features) -> (f, i, z), for example
      `GateNetwork().apply`.
    precision: the diagonal precision of theta_0 (`diagonal_fisher`), a tree
      like the parameters; None gives ones.
  """

  def init_fn(params):
    return LearnedUpdateState(
      theta0=jax.tree.map(jnp.copy, params),
      precision=jax.tree.map(
        jnp.ones_like if precision is None else jnp.copy,
        params if precision is None else precision,
      ),
    )

  def update_fn(grads, state, params=None, *, meta_params=None, loss=None, **extra):
    del extra
    if params is None or meta_params is None or loss is None:
      raise ValueError(
        'the learned rule needs params, meta_params and the loss it reads: '
        'update(grads, state, params, meta_params=..., loss=...)'
      )

    def rule(p, g, p0, precision):
      f, i, z = gate_fn(meta_params, coordinate_features(p, g, p0, precision, loss))
      return f * p + i * g + z * p0 - p

    return jax.tree.map(rule, params, grads, state.theta0, state.precision), state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
