"""Experiments beyond one training run (reverse copy, the adaptive feed-forward
tasks, the robustness study, seed studies and their evaluations): each a
function config -> result rows."""

from lm_zoo.tasks.adaptive_ff import (
  build_feedforward,
  feedforward_spec,
  run_mnist,
  run_tail_regression,
  tail_regression_data,
)
from lm_zoo.tasks.reverse_copy import (
  EncoderDecoder,
  ReverseCopyData,
  fit,
  reverse_copy_data,
  run_experiment,
  sequence_cross_entropy,
)
from lm_zoo.tasks.robustness import offset_rates, run_robustness, sample_offsets
from lm_zoo.tasks.seeds import run_seed_study, seed_report, summarise

# config.task -> the function that runs it (lm-zoo-task).
TASKS = {
  'reverse_copy': run_experiment,
  'tail_regression': run_tail_regression,
  'mnist': run_mnist,
  'robustness': run_robustness,
  'seeds': run_seed_study,
}

# config.task -> a function (rows, config) -> the Markdown summary printed
# after the rows.
REPORTS = {
  'seeds': lambda rows, config: seed_report(
    rows, config.reference, list(config.get('evaluations') or {})
  ),
}

__all__ = [
  'REPORTS',
  'TASKS',
  'EncoderDecoder',
  'ReverseCopyData',
  'build_feedforward',
  'feedforward_spec',
  'fit',
  'offset_rates',
  'reverse_copy_data',
  'run_experiment',
  'run_mnist',
  'run_robustness',
  'run_seed_study',
  'run_tail_regression',
  'sample_offsets',
  'seed_report',
  'summarise',
  'sequence_cross_entropy',
  'tail_regression_data',
]
