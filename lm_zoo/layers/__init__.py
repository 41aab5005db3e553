"""Reusable layers."""

from lm_zoo.layers.low_rank import LowRankDense, factor_init

__all__ = ['LowRankDense', 'factor_init']
