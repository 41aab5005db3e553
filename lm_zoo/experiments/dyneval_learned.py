"""The meta-learned update rule (Wolf et al. 2018): meta-train it for a
trained model, then score with it.

  lm-zoo-meta-train --workdir=W --config=experiments/dyneval_learned.py
  # starts as RMS dynamic evaluation:
  lm-zoo-meta-train --workdir=W --config=experiments/dyneval_learned.py:rms
  lm-zoo-eval --workdir=W --config=experiments/evaluate.py:learned    # scores with it again

`lm-zoo-meta-train` reads the whole config and scores with the rule it
trained by its `evaluation` section; `lm-zoo-eval` reads that section too
(`--config.evaluation.FIELD=...`), or `experiments/evaluate.py:learned`,
the same evaluation config at the top level (`--config.FIELD=...`).
"""

from lm_zoo.configs import meta_training_config

VARIANTS = ('sgd', 'rms')


def get_config(prior: str = 'sgd'):
  if prior not in VARIANTS:
    raise ValueError(f'prior must be one of {", ".join(VARIANTS)}, got {prior!r}')
  c = meta_training_config()
  c.prior = prior
  return c
