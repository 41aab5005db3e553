"""Optimizer-like transformations over parameter trees (optax style)."""

from lm_zoo.optim.dynamic_evaluation import (DECAY_MEANS, DynamicEvalResult,
                                             DynamicEvalState, dynamic_evaluate,
                                             dynamic_rms, dynamic_sgd, mean_ms,
                                             rms_training_gradients)
from lm_zoo.optim.learned_update import (DECAY_CLIPS, NUM_FEATURES, GateNetwork, LearnedUpdateState,
                                         MetaTrainResult, RMSGateNetwork, coordinate_features,
                                         decay_logits, diagonal_fisher, learned_update_rule,
                                         mean_rms, meta_loss, meta_train, stream_windows)

__all__ = ['DECAY_CLIPS', 'DECAY_MEANS', 'DynamicEvalResult', 'DynamicEvalState', 'dynamic_evaluate',
           'dynamic_rms', 'dynamic_sgd', 'mean_ms', 'rms_training_gradients', 'GateNetwork',
           'LearnedUpdateState', 'coordinate_features', 'decay_logits', 'diagonal_fisher',
           'learned_update_rule', 'meta_loss', 'MetaTrainResult', 'NUM_FEATURES', 'meta_train',
           'stream_windows', 'RMSGateNetwork', 'mean_rms']
