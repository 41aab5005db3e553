"""Optimizer-like transformations over parameter trees (optax style)."""

from lm_zoo.optim.dynamic_evaluation import (DECAY_CLIPS, DynamicEvalResult,
                                             DynamicEvalState, dynamic_evaluate,
                                             dynamic_rms, dynamic_sgd,
                                             rms_training_gradients)

__all__ = ['DECAY_CLIPS', 'DynamicEvalResult', 'DynamicEvalState', 'dynamic_evaluate',
           'dynamic_rms', 'dynamic_sgd', 'rms_training_gradients']
