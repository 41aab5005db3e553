"""The Mogrifier ablation (paper Table 3, Fig. 3) at a size that trains on 2 CPU cores.

Every variant uses `lm_zoo.experiments.recipes.small_ptb_config()`: the same 3M parameter
budget (hidden size solved for it), tied embeddings and the same short
schedule (2 epochs; Adam beta1 = 0, clip 10,
BPTT 35, batch 32). Variants (`--config=...py:VARIANT`):

  lstm          the plain LSTM
  r1 ... r6     Mogrifier with r rounds, rank 40
  nozigzag      r = 5, every round looks at the original x and h
  fullrank      r = 5, full-rank Q, R
  mlstm         the multiplicative LSTM

Paper (PTB, 24M, valid): LSTM 57.5, Mogrifier 54.1, no zigzag 55.0,
full rank 54.6, mLSTM 57.8.
"""

from lm_zoo.experiments.recipes import small_ptb_config

VARIANTS = ('lstm', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'nozigzag', 'fullrank', 'mlstm')


def get_config(variant: str = 'r5'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = small_ptb_config()
  mog = c.model.mogrifier
  if variant.startswith('r'):
    mog.update(rounds=int(variant[1:]), rank=40)
  elif variant == 'nozigzag':
    mog.update(rounds=5, rank=40, zigzag=False)
  elif variant == 'fullrank':
    mog.update(rounds=5, rank=0)
  elif variant == 'mlstm':
    c.model.cell = 'mlstm'
  return c
