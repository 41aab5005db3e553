"""Dynamic evaluation with RMS-normalised steps decaying toward the trained
weights (Krause et al. 2018; the Mogrifier paper's dyneval):

  lm-zoo-eval --workdir=W --config=experiments/dyneval_rms.py
  --config=experiments/dyneval_rms.py:krause   # mean(MS) over tensors, as Krause's code

theta <- theta - eta g / (MS + eps) + min(1, lambda MS / mean(MS)) (theta_g - theta),
with MS the RMS of training gradients; mean(MS) over every coordinate as
lamb's dyneval.py (the default) or over the parameter tensors as Krause's
dynamiceval.py. The grid spans the learning rates and decays that
searches on PTB and WikiText-2 choose among.
"""

from lm_zoo.configs import evaluation_config

VARIANTS = ('lamb', 'krause')


def get_config(variant: str = 'lamb'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = evaluation_config('dynamic')
  c.dynamic.update(
    rule='rms',
    learning_rate=(3e-5, 1e-4, 3e-4),
    decay=(0.0, 1e-3),
    eps=(1e-3,),
    segment_length=(5,),
    decay_mean='coordinates' if variant == 'lamb' else 'tensors',
  )
  return c
