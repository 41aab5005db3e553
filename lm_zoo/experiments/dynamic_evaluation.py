"""Small trained models for dynamic evaluation and the meta-learned update
rule, at sizes that train on 2 CPU cores.

  ptb        the small PTB LSTM of `small_ptb_config` (3M parameters, 2 epochs);
             the same model as ptb_mogrifier_ablation.py:lstm
  wikitext2  the same recipe on WikiText-2: 2 x 200 units, tied 200-d
             embeddings (7.3M parameters, 6.7M of them the 33,278-word
             embedding), 1 epoch, validation at batch 10

Then, for example:
  lm-zoo-eval --workdir=runs/dyn_ptb --config=experiments/dyneval_rms.py
  lm-zoo-meta-train --workdir=runs/dyn_ptb --config=experiments/dyneval_learned.py
"""

from lm_zoo.experiments.recipes import small_ptb_config

VARIANTS = ('ptb', 'wikitext2')


def get_config(variant: str = 'ptb'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = small_ptb_config()
  if variant == 'wikitext2':
    c.data.update(name='wikitext2', eval_batch_size=10)
    c.model.update(param_budget=0, embed_size=200, hidden_size=200)
    c.train.update(num_epochs=1, log_every=300)
  return c
