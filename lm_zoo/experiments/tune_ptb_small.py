"""A small tuning study that runs on 2 CPU cores: the Mogrifier paper's Table 4
ranges on the 3M-parameter PTB recipe of the ablations
(`lm_zoo.experiments.recipes.small_ptb_config`), each trial 300 steps (336k
tokens, a third of an epoch) with a validation turn every 100 steps for the
median pruner.

Variants `lstm` and `mogrifier` (rounds and rank tuned too) share the budget,
the number of trials and the seed, so their best scores compare:

  lm-zoo-tune --tune=experiments/tune_ptb_small.py:lstm --workdir=runs/tune_lstm
  lm-zoo-tune --tune=experiments/tune_ptb_small.py:mogrifier --workdir=runs/tune_mog
"""

from lm_zoo.experiments.recipes import small_ptb_config
from lm_zoo.tuning import mogrifier_table4, tuning_config


def get_config(variant: str = 'lstm'):
  if variant not in ('lstm', 'mogrifier'):
    raise ValueError(f"variant must be 'lstm' or 'mogrifier', got {variant!r}")
  c = tuning_config()
  c.base = small_ptb_config()
  # Validation at batch 10 over the whole split keeps each turn to seconds.
  c.base.data.eval_batch_size = 10
  c.base.train.update(max_steps=300, eval_every=100, log_every=100, checkpoint_every=100)
  c.base.generate.num_lines = 0
  c.space = mogrifier_table4(mogrifier=variant == 'mogrifier')
  c.study.update(
    name=f'ptb_small_{variant}',
    num_trials=8,
    seed=0,
    startup_trials=4,
    pruner='median',
    pruner_startup_trials=3,
    pruner_warmup_steps=100,
  )
  return c
