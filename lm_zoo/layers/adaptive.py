"""Adaptive parameterization (Flennerhag et al., NeurIPS 2018): the adaptive
feed-forward layer of eq. (2)-(4) and the policy networks that drive it."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.errors import ConfigError
from lm_zoo.layers.products import matmul

Initializer = Callable[..., jax.Array]

# Which diagonal slots D^(1)..D^(q) adapt (False: the identity), with one weight
# matrix between neighbouring slots: (a, b, c) is D^(3) W^(2) D^(2) W^(1) D^(1) x.
POLICIES: dict[str, tuple[bool, ...]] = {
  'input': (True, False),  # W D x
  'output': (False, True),  # D W x
  'io': (True, True),  # D^(2) W D^(1) x, eq. (3)
  'sva': (False, True, False),  # W^(2) D W^(1) x, eq. (4)
}


def policy_slots(policy: str | int | Sequence[bool]) -> tuple[bool, ...]:
  """The slots of a named policy, of order q (every slot adapts), or as given."""
  if isinstance(policy, str):
    if policy not in POLICIES:
      raise ConfigError(
        f'unknown adaptation policy {policy!r}: choose one of '
        f'{", ".join(POLICIES)}, an order q >= 2 or a tuple of bools'
      )
    return POLICIES[policy]
  if isinstance(policy, int):
    if policy < 2:
      raise ConfigError(f'an adaptation policy of order q needs q >= 2, got {policy}')
    return (True,) * policy
  slots = tuple(bool(s) for s in policy)
  if len(slots) < 2:
    raise ConfigError(f'an adaptation policy needs at least two slots, got {policy}')
  return slots


class LinearPolicy(nn.Module):
  """π(v) = U v + 1: starts as the unit policy, so a fresh adaptive layer is
  exactly its static counterpart and learns to adapt from there."""

  features: int

  @nn.compact
  def __call__(self, v: jax.Array) -> jax.Array:
    return nn.Dense(
      self.features, kernel_init=nn.initializers.zeros_init(), bias_init=nn.initializers.ones_init()
    )(v)


class FeedForwardPolicy(nn.Module):
  """π(v) = U φ(W v + b) + c, a one-hidden-layer network. c starts at one, so
  a fresh layer is near its static counterpart however many are stacked."""

  features: int
  hidden: int = 32
  activation: Callable[[jax.Array], jax.Array] = nn.relu

  @nn.compact
  def __call__(self, v: jax.Array) -> jax.Array:
    hidden = self.activation(nn.Dense(self.hidden, name='hidden')(v))
    return nn.Dense(self.features, bias_init=nn.initializers.ones_init(), name='out')(hidden)


class GLUPolicy(nn.Module):
  """π(v) = (W v + b) ⊙ σ(V v + c), a gated linear unit (Dauphin et al. 2017),
  the policy of the paper's extreme tail regression."""

  features: int

  @nn.compact
  def __call__(self, v: jax.Array) -> jax.Array:
    value, gate = jnp.split(nn.Dense(2 * self.features)(v), 2, axis=-1)
    return value * nn.sigmoid(gate)


class AdaptiveDense(nn.Module):
  """The adaptive feed-forward layer, eq. (2) without its activation:

      f(x) = D^(q) W^(q-1) ··· W^(1) D^(1) x + D^(0) b,   D^(j) = diag(π^(j))

  `policy` picks which D^(j) adapt: 'input' W D x, 'output' D W x, 'io'
  D^(2) W D^(1) x (eq. 3), 'sva' W^(2) D W^(1) x (eq. 4), an int q (every
  slot of order q adapts) or a tuple of bools. The policies come from
  `policy_net(features=total)` applied to `condition` (x when not given), its
  output split over the adapting slots (then D^(0) when `adapt_bias`); or
  they are passed in ready (`policies`, one array per adapting slot, then
  D^(0)), as the aLSTM does. With unit policies this is the static layer
  W^(q-1) ··· W^(1) x + b.

  Attributes:
    features: output size.
    policy: which slots adapt (see above).
    inner_features: sizes of the spaces between the weight matrices (one
      fewer than the matrices); default `features` for each. For SVA, the
      size of the adapted singular values.
    policy_net: module constructor taking `features=`; `LinearPolicy`,
      `FeedForwardPolicy`, `GLUPolicy` or any other.
    use_bias, adapt_bias: add b; scale it by the policy D^(0).
    kernel_init: initialiser of every W (orthogonal: semi-orthogonal as in
      the paper's SVA).
    bias_init: initialiser of b.
    dtype: the weight products' dtype (None: from the inputs; bfloat16 sums
      and returns float32, `products.matmul`); the policies scale the float32
      results.
    param_dtype: parameter dtype.
  """

  features: int
  policy: str | int | Sequence[bool] = 'io'
  inner_features: Sequence[int] = ()
  policy_net: Callable[..., nn.Module] = LinearPolicy
  use_bias: bool = True
  adapt_bias: bool = True
  kernel_init: Initializer = nn.initializers.orthogonal()
  bias_init: Initializer = nn.initializers.zeros_init()
  dtype: Any = None
  param_dtype: Any = jnp.float32

  def slot_sizes(self, num_inputs: int) -> list[int]:
    """The size of each slot D^(1)..D^(q) for inputs of size `num_inputs`."""
    slots = policy_slots(self.policy)
    inner = list(self.inner_features) or [self.features] * (len(slots) - 2)
    if len(inner) != len(slots) - 2:
      raise ConfigError(
        f'policy {self.policy!r} has {len(slots) - 1} weight matrices, '
        f'so inner_features needs {len(slots) - 2} sizes, got {inner}'
      )
    return [num_inputs, *inner, self.features]

  def policy_sizes(self, num_inputs: int) -> list[int]:
    """The sizes of the policies the layer consumes, in order."""
    slots = policy_slots(self.policy)
    sizes = [n for n, adapts in zip(self.slot_sizes(num_inputs), slots) if adapts]
    return sizes + ([self.features] if self.use_bias and self.adapt_bias else [])

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    condition: jax.Array | None = None,
    *,
    policies: Sequence[jax.Array] | None = None,
  ) -> jax.Array:
    sizes = self.policy_sizes(x.shape[-1])
    if policies is None:
      flat = self.policy_net(features=sum(sizes), name='policy')(
        x if condition is None else condition
      )
      policies = split_sizes(flat, sizes)
    elif [p.shape[-1] for p in policies] != sizes:
      raise ConfigError(
        f'AdaptiveDense({self.features}, policy={self.policy!r}) takes '
        f'policies of sizes {sizes}, got {[p.shape[-1] for p in policies]}'
      )
    policies = iter(policies)
    slot_sizes = self.slot_sizes(x.shape[-1])
    for j, adapts in enumerate(policy_slots(self.policy)):
      if j > 0:
        kernel = self.param(
          f'kernel_{j}', self.kernel_init, (slot_sizes[j - 1], slot_sizes[j]), self.param_dtype
        )
        x = matmul(x, kernel, self.dtype)
      if adapts:
        x = x * next(policies)
    if self.use_bias:
      bias = self.param('bias', self.bias_init, (self.features,), self.param_dtype)
      x = x + (bias * next(policies) if self.adapt_bias else bias)
    return x


def split_sizes(v: jax.Array, sizes: Sequence[int]) -> list[jax.Array]:
  """`v` cut along its last axis into consecutive parts of `sizes`."""
  return jnp.split(v, np.cumsum(sizes)[:-1].tolist(), axis=-1)
