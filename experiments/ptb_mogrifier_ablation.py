"""The Mogrifier ablation (paper Table 3, Fig. 3) at a size that trains on 2 CPU cores.

Every variant has the same 3M parameter budget (hidden size solved for it),
tied embeddings and the same short schedule: 2 epochs (about 10 min each on
2 cores), Adam beta1 = 0, clip 10, BPTT 35, batch 32, dropout as below. Variants (`--config=...py:VARIANT`):

  lstm          the plain LSTM
  r1 ... r6     Mogrifier with r rounds, rank 40
  nozigzag      r = 5, every round looks at the original x and h
  fullrank      r = 5, full-rank Q, R
  mlstm         the multiplicative LSTM

Paper (PTB, 24M, valid): LSTM 57.5, Mogrifier 54.1, no zigzag 55.0,
full rank 54.6, mLSTM 57.8.
"""

from lm_zoo.configs import base_config

VARIANTS = ('lstm', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'nozigzag', 'fullrank', 'mlstm')


def get_config(variant: str = 'r5'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = base_config()
  # Validation at batch 1, as for test: from a zero state, a briefly trained
  # Mogrifier can lock a batch row into a runaway cell state (see WORKSPACE.md).
  c.data.update(name='ptb', batch_size=32, bptt=35, eval_batch_size=1)
  c.model.update(num_layers=2, embed_size=0, tie_embeddings=True,
                 param_budget=3_000_000, dropout_input=0.4, dropout_hidden=0.2,
                 dropout_state=0.1, dropout_output=0.4)
  mog = c.model.mogrifier
  if variant.startswith('r'):
    mog.update(rounds=int(variant[1:]), rank=40)
  elif variant == 'nozigzag':
    mog.update(rounds=5, rank=40, zigzag=False)
  elif variant == 'fullrank':
    mog.update(rounds=5, rank=0)
  elif variant == 'mlstm':
    c.model.cell = 'mlstm'
  c.optimizer.update(name='adam', learning_rate=3e-3, beta1=0.0, beta2=0.999,
                     clip_norm=10.0, l2=0.0)
  c.schedule.update(kind='plateau', factor=0.5)
  c.train.update(num_epochs=2, log_every=200, checkpoint_every=2000)
  return c
