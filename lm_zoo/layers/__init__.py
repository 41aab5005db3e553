"""Reusable layers."""

from lm_zoo.layers.adaptive import (POLICIES, AdaptiveDense, FeedForwardPolicy, GLUPolicy,
                                    LinearPolicy, policy_slots, split_sizes)
from lm_zoo.layers.low_rank import LowRankDense, factor_init

__all__ = ['POLICIES', 'AdaptiveDense', 'FeedForwardPolicy', 'GLUPolicy', 'LinearPolicy',
           'LowRankDense', 'factor_init', 'policy_slots', 'split_sizes']
