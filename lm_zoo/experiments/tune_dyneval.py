"""Tuning dynamic evaluation of a trained model over the Mogrifier paper's
Table 6 ranges (segment length, learning rate, decay, epsilon), RMS variant
with the decay toward the trained weights. Each trial scores the first
`dyneval.evaluation.dynamic.search_tokens` validation tokens at batch 1.

  lm-zoo-tune --tune=experiments/tune_dyneval.py --tune.dyneval.workdir=runs/x \
      --workdir=runs/x/tune_dyneval
  --tune=experiments/tune_dyneval.py:char   # segments up to 50 characters
"""

from lm_zoo.tuning import dyneval_table6, tuning_config


def get_config(unit: str = 'word'):
  if unit not in ('word', 'char'):
    raise ValueError(f"unit must be 'word' or 'char', got {unit!r}")
  c = tuning_config()
  c.kind = 'dyneval'
  c.space = dyneval_table6(unit)
  c.dyneval.evaluation.dynamic.update(rule='rms', search_tokens=10_000)
  c.study.update(name=f'dyneval_{unit}', num_trials=20, pruner='none')
  return c
