"""Tuning the Mogrifier paper's models as it did (appendix A), for accelerator hosts.

Variants: `lstm` and `mogrifier` search the paper's Table 4 on the 24M PTB
recipe of experiments/mogrifier_paper.py (lamb's published config with its
tuned values replaced by each trial's); `enwik8_lstm` and `enwik8_mogrifier`
search Table 5 on its 96M Enwik8 recipe (4 layers, BPTT 500, batch 128,
untied embeddings). Every trial has the variant's parameter budget: the
hidden size is solved for it after the sampled embedding ratio, rounds and
rank are set. The paper ran a Gaussian-process bandit (Vizier) over whole
training runs; here Optuna's TPE samples and the median pruner stops trials
whose validation loss (every 1000 steps) is worse than the median at the
same step.

  lm-zoo-tune --tune=experiments/tune_mogrifier.py:mogrifier --workdir=runs/tune_mog \
      --tune.study.storage=postgresql://USER:PASSWORD@HOST/DB   # one per host
"""

import pathlib
import runpy

from lm_zoo.tuning import mogrifier_table4, mogrifier_table5, tuning_config

# The paper's recipes in the sibling file (experiments/ is not a package).
mogrifier_paper = runpy.run_path(str(pathlib.Path(__file__).with_name('mogrifier_paper.py')))

VARIANTS = ('lstm', 'mogrifier', 'enwik8_lstm', 'enwik8_mogrifier')


def get_config(variant: str = 'mogrifier'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  mogrifier = variant.endswith('mogrifier')
  c = tuning_config()
  model = 'mogrifier' if mogrifier else 'lstm'
  if variant.startswith('enwik8'):
    c.base = mogrifier_paper['get_config'](f'enwik8_96m_{model}')
    c.space = mogrifier_table5(mogrifier)
  else:
    c.base = mogrifier_paper['get_config'](f'ptb_{model}')
    c.space = mogrifier_table4(mogrifier)
  c.base.generate.num_lines = 0
  c.study.update(
    name=f'mogrifier_paper_{variant}', num_trials=200, pruner='median', pruner_warmup_steps=5000
  )
  return c
