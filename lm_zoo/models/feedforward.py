"""Feed-forward networks whose layers may be adaptive (Flennerhag et al. 2018,
sections 5.1 and 5.2)."""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax

from lm_zoo.layers.adaptive import AdaptiveDense, GLUPolicy


class FeedForward(nn.Module):
  """Dense layers of widths `features` (the last is the output), with
  `activation` between them; layer i is an `AdaptiveDense` when
  `adaptive[i]`, its policy computed from that layer's input.

  Attributes:
    features: the width of each layer, the output last.
    adaptive: which layers adapt (default none: a plain MLP).
    policy: the adaptive layers' policy ('sva', 'io', ...).
    inner_features: SVA's adaptation size per layer (0: the layer's width).
    policy_net: the adaptive layers' policy network constructor.
    activation: between layers (not after the last).
  """

  features: Sequence[int]
  adaptive: Sequence[bool] = ()
  policy: str = 'sva'
  inner_features: int = 0
  policy_net: Callable[..., nn.Module] = GLUPolicy
  activation: Callable[[jax.Array], jax.Array] = nn.relu

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    adaptive = tuple(self.adaptive) or (False,) * len(self.features)
    if len(adaptive) != len(self.features):
      raise ValueError(f'adaptive has {len(adaptive)} flags for {len(self.features)} layers')
    for i, (width, adapts) in enumerate(zip(self.features, adaptive)):
      if i > 0:
        x = self.activation(x)
      if adapts:
        inner = (self.inner_features or width,) if self.policy == 'sva' else ()
        x = AdaptiveDense(
          width, self.policy, inner_features=inner, policy_net=self.policy_net, name=f'layer_{i}'
        )(x)
      else:
        x = nn.Dense(width, name=f'layer_{i}')(x)
    return x
