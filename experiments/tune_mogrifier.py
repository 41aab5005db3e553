"""Tuning the Mogrifier paper's models as it did (appendix A), for accelerator hosts.

Variants: `lstm` and `mogrifier` search the paper's Table 4 on the 24M PTB
recipe of experiments/ptb_mogrifier.py; `enwik8_lstm` and `enwik8_mogrifier`
search Table 5 on Enwik8 (4 layers, 96M parameters, BPTT 500, batch 128,
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

from lm_zoo.configs import base_config
from lm_zoo.tuning import mogrifier_table4, mogrifier_table5, tuning_config

# The 24M PTB recipe of the sibling file (experiments/ is not a package).
ptb_mogrifier = runpy.run_path(str(pathlib.Path(__file__).with_name('ptb_mogrifier.py')))

VARIANTS = ('lstm', 'mogrifier', 'enwik8_lstm', 'enwik8_mogrifier')


def _enwik8(mogrifier: bool):
  c = base_config()
  c.data.update(name='enwik8', batch_size=128, bptt=500, eval_batch_size=16)
  c.model.update(num_layers=4, embed_size=0, tie_embeddings=False, param_budget=96_000_000)
  if mogrifier:
    c.model.mogrifier.update(rounds=5, rank=40)
  c.optimizer.update(name='adam', learning_rate=2e-3, beta1=0.0, clip_norm=10.0)
  c.schedule.update(kind='plateau', factor=0.5, min_lr=1e-4)
  c.train.update(num_epochs=10, log_every=200, checkpoint_every=2000)
  return c


def get_config(variant: str = 'mogrifier'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  mogrifier = variant.endswith('mogrifier')
  c = tuning_config()
  if variant.startswith('enwik8'):
    c.base = _enwik8(mogrifier)
    c.space = mogrifier_table5(mogrifier)
  else:
    c.base = ptb_mogrifier['get_config']('mogrifier' if mogrifier else 'lstm')
    c.space = mogrifier_table4(mogrifier)
  c.base.train.eval_every = 1000
  c.base.generate.num_lines = 0
  c.study.update(name=f'mogrifier_paper_{variant}', num_trials=200, pruner='median',
                 pruner_warmup_steps=5000)
  return c
