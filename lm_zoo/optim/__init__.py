"""Optimizer-like transformations over parameter trees, in optax's style:
dynamic evaluation's SGD and RMS rules, the meta-learned update rule and its
gate networks, and parameter averaging. Nothing here reads data or runs a
model; `lm_zoo.evaluation` drives these along token streams."""

from lm_zoo.optim.averaging import (
  ParameterAveragingState,
  averaged_params,
  averaging_state,
  is_averaging,
  parameter_averaging,
  start_averaging,
)
from lm_zoo.optim.dynamic_evaluation import (
  DECAY_MEANS,
  DecayMean,
  DecayTowardTrainedState,
  ScaleByFixedRmsState,
  decay_toward_trained,
  dynamic_rms,
  dynamic_sgd,
  mean_ms,
  scale_by_fixed_rms,
)
from lm_zoo.optim.learned_update import (
  NUM_FEATURES,
  PRECISION_FLOOR,
  GateFn,
  GateNetwork,
  LearnedUpdateState,
  RMSGateNetwork,
  coordinate_features,
  decay_logits,
  learned_update_rule,
  mean_rms,
)

__all__ = [
  'DECAY_MEANS',
  'DecayMean',
  'DecayTowardTrainedState',
  'GateFn',
  'GateNetwork',
  'LearnedUpdateState',
  'NUM_FEATURES',
  'PRECISION_FLOOR',
  'ParameterAveragingState',
  'RMSGateNetwork',
  'ScaleByFixedRmsState',
  'averaged_params',
  'averaging_state',
  'coordinate_features',
  'decay_logits',
  'decay_toward_trained',
  'dynamic_rms',
  'dynamic_sgd',
  'is_averaging',
  'learned_update_rule',
  'mean_ms',
  'mean_rms',
  'parameter_averaging',
  'scale_by_fixed_rms',
  'start_averaging',
]
