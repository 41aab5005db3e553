"""Scoring a trained model (`lm-zoo-eval --workdir=W --config=experiments/evaluate.py:VARIANT`).

  static        dropout off, valid and test (the default of lm-zoo-eval)
  mc_dropout    Monte-Carlo dropout over 50 masks (the Mogrifier paper: 200)
  temperature   the softmax temperature that minimises the validation loss
  token_losses  every token's loss (with --output; lm-zoo-plot draws two runs' difference)
  learned       dynamic evaluation with the meta-learned rule (lm-zoo-meta-train first)
                in WORKDIR/meta_learner, or another folder: --config.learned.meta_learner

Dynamic evaluation: experiments/dyneval_sgd.py, dyneval_rms.py, dyneval_learned.py.
"""

from lm_zoo.configs import evaluation_config

VARIANTS = ('static', 'mc_dropout', 'temperature', 'token_losses', 'learned')


def get_config(variant: str = 'static'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  return evaluation_config(variant)
