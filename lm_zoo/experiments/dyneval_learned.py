"""The meta-learned update rule (Wolf et al. 2018): meta-train it for a
trained model, then score with it.

  lm-zoo-meta-train --workdir=W --config=experiments/dyneval_learned.py
  # starts as RMS dynamic evaluation:
  lm-zoo-meta-train --workdir=W --config=experiments/dyneval_learned.py:rms
  lm-zoo-eval --workdir=W --config=experiments/dyneval_learned.py      # scores with it again

`lm-zoo-eval` reads the config's `evaluation` section (the 'learned'
evaluator); `lm-zoo-meta-train` reads the whole config.
"""

from lm_zoo.configs import meta_training_config

VARIANTS = ('sgd', 'rms')


def get_config(prior: str = 'sgd'):
  if prior not in VARIANTS:
    raise ValueError(f'prior must be one of {", ".join(VARIANTS)}, got {prior!r}')
  c = meta_training_config()
  c.prior = prior
  return c
