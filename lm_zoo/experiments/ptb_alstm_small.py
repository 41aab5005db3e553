"""LSTM against the aLSTM on PTB at a size that trains on 2 CPU cores (the
direction of the aLSTM paper's Table 4).

Every variant uses `lm_zoo.experiments.recipes.small_ptb_config()`, the recipe of the
Mogrifier ablation (3M parameter budget, hidden size solved for it, 2 epochs),
so the `lstm` row is the same run as that ablation's. Variants
(`--config=...py:VARIANT`):

  lstm          the plain LSTM
  static        aLSTM, IO adaptation, feed-forward adaptation model (eq. 6)
  recurrent     aLSTM, IO adaptation, LSTM adaptation model (eq. 7)
  lstm_rhn      aLSTM, IO adaptation, LSTM adaptation models wired across
                layers as the LSTM-RHN (eq. 9)

The adaptation model has size 100 as in the paper. Paper (PTB, 17M, valid):
LSTM 71.7, aLSTM IO feed-forward 61.6, IO LSTM 59.0, IO LSTM-RHN 58.5.
"""

from lm_zoo.experiments.recipes import small_ptb_config

# aLSTM variant -> its adaptation model (model.alstm.latent).
LATENTS = {'static': 'static', 'recurrent': 'lstm', 'lstm_rhn': 'lstm_rhn'}
VARIANTS = ('lstm', *LATENTS)


def get_config(variant: str = 'recurrent'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = small_ptb_config()
  if variant != 'lstm':
    c.model.cell = 'alstm'
    c.model.alstm.update(latent=LATENTS[variant], latent_size=100)
  return c
