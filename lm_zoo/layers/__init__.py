"""Reusable layers."""

from lm_zoo.layers.adaptive import (
  POLICIES,
  AdaptiveDense,
  FeedForwardPolicy,
  GLUPolicy,
  LinearPolicy,
  policy_slots,
  split_sizes,
)
from lm_zoo.layers.dual import DualConnection
from lm_zoo.layers.low_rank import LowRankDense, factor_init, low_rank_linear
from lm_zoo.layers.mixture_of_softmaxes import MixtureOfSoftmaxes
from lm_zoo.layers.output import OutputEmbedding

__all__ = [
  'POLICIES',
  'AdaptiveDense',
  'DualConnection',
  'FeedForwardPolicy',
  'GLUPolicy',
  'LinearPolicy',
  'LowRankDense',
  'MixtureOfSoftmaxes',
  'OutputEmbedding',
  'factor_init',
  'low_rank_linear',
  'policy_slots',
  'split_sizes',
]
