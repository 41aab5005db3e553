"""Scoring trained models: perplexity and bits per character of token
streams, MC dropout, tuned temperatures, dynamic evaluation and the learned
rule along a stream, the gradient statistics they need, meta-training the
learned rule, and the evaluators that run each way from a config."""

from lm_zoo.evaluation.dynamic import (
  DynamicEvalResult,
  DynamicMember,
  dynamic_evaluate,
  dynamic_evaluate_many,
)
from lm_zoo.evaluation.dynamic_choice import DynamicChoice, DynamicEvalSettings, DynamicSetup
from lm_zoo.evaluation.dynamic_evaluators import Dynamic, Learned
from lm_zoo.evaluation.dynamic_rules import (
  DYNAMIC_RULES,
  DynamicRule,
  DynamicRuleSpec,
  register_dynamic_rule,
)
from lm_zoo.evaluation.evaluators import (
  Evaluator,
  MCDropout,
  Prepared,
  Static,
  TokenLosses,
  TunedTemperature,
)
from lm_zoo.evaluation.mc_dropout import make_mc_dropout_eval_step, mc_dropout_carries
from lm_zoo.evaluation.meta_training import (
  MetaLearner,
  MetaTrainResult,
  MetaTrainState,
  meta_loss,
  meta_train,
  stream_windows,
)
from lm_zoo.evaluation.registry import (
  EvaluatorName,
  build_evaluator,
  needs_meta_learner,
  register_evaluator,
  split_names,
)
from lm_zoo.evaluation.results import EvalResult, mean_and_spread, perplexity
from lm_zoo.evaluation.statistics import diagonal_fisher, rms_training_gradients
from lm_zoo.evaluation.streams import (
  evaluate_split,
  evaluate_stream,
  evaluate_stream_stacked,
  make_eval_step,
  token_losses,
  tune_temperature,
)

__all__ = [
  'DYNAMIC_RULES',
  'Dynamic',
  'DynamicChoice',
  'DynamicEvalResult',
  'DynamicMember',
  'DynamicEvalSettings',
  'DynamicRule',
  'DynamicRuleSpec',
  'DynamicSetup',
  'EvalResult',
  'Evaluator',
  'EvaluatorName',
  'Learned',
  'MCDropout',
  'MetaLearner',
  'MetaTrainResult',
  'MetaTrainState',
  'Prepared',
  'Static',
  'TokenLosses',
  'TunedTemperature',
  'build_evaluator',
  'needs_meta_learner',
  'diagonal_fisher',
  'dynamic_evaluate',
  'dynamic_evaluate_many',
  'evaluate_split',
  'evaluate_stream',
  'evaluate_stream_stacked',
  'make_eval_step',
  'make_mc_dropout_eval_step',
  'mc_dropout_carries',
  'mean_and_spread',
  'perplexity',
  'meta_loss',
  'meta_train',
  'register_dynamic_rule',
  'register_evaluator',
  'rms_training_gradients',
  'split_names',
  'stream_windows',
  'token_losses',
  'tune_temperature',
]
