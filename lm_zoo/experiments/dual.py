"""The dual input-to-output connection (dual-connection-current-input.txt).
Variants (`--config=...py:VARIANT`):

  paper           the tuned Dual mdLSTM of the paper's section 4.2, for
                  accelerator hosts: embedding 850, two Mogrifier LSTM layers
                  of 850 (4 rounds, rank 100), dual size 850, tied softmax;
                  dropout .5 on the input, state, between layers and output,
                  dual input .5, dual output .4; Nadam, batch 32, BPTT 25, 300
                  epochs (paper: PTB test 51.19, 23M parameters). The paper's
                  learning rate and L2 values did not survive in its text: lr
                  1e-3 is the top of its search range, L2 is off, and its
                  Mogrifier dropout (.15) has no counterpart here.
  lstm_dual       ERS -> Dual at small scale, the dual paper's Table 1
  mogrifier_dual  direction: `ptb_mogrifier_ablation.py:lstm` and `:r2` (the
                  2-epoch, 3M-parameter recipe of `small_ptb_config`) with a
                  dual layer of the hidden size added, hyper-parameters
                  transferred from ERS unchanged as in the paper: the same
                  hidden size (so more parameters), dual input dropout .1,
                  dual output dropout .4 (the ERS softmax's input dropout).

  lm-zoo-train --config=experiments/dual.py:lstm_dual --workdir=runs/dual_lstm
"""

from lm_zoo.configs import base_config
from lm_zoo.experiments.recipes import small_ptb_config

VARIANTS = ('paper', 'lstm_dual', 'mogrifier_dual')

# The hidden sizes that the ERS configs (ptb_mogrifier_ablation.py:lstm, :r2)
# solve for their 3M budget, checked in tests/test_configs.py; fixed here so
# that the dual model keeps them.
ERS_HIDDEN = {'lstm_dual': 220, 'mogrifier_dual': 216}


def get_config(variant: str = 'lstm_dual'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  if variant == 'paper':
    c = base_config()
    c.data.update(name='ptb', batch_size=32, bptt=25, eval_batch_size=10, test_batch_size=1)
    c.model.update(
      num_layers=2,
      embed_size=850,
      hidden_size=850,
      tie_embeddings=True,
      dropout_input=0.5,
      dropout_state=0.5,
      dropout_hidden=0.5,
      dropout_output=0.5,
    )
    c.model.mogrifier.update(rounds=4, rank=100)
    c.model.dual.update(size=850, dropout_input=0.5, dropout_output=0.4)
    c.optimizer.update(name='nadam', learning_rate=1e-3, beta1=0.9, beta2=0.999, clip_norm=0.0)
    c.train.update(num_epochs=300, log_every=200, checkpoint_every=2000)
    return c
  c = small_ptb_config()
  if variant == 'mogrifier_dual':
    c.model.mogrifier.update(rounds=2, rank=40)
  hidden = ERS_HIDDEN[variant]
  c.model.update(param_budget=0, hidden_size=hidden)
  c.model.dual.update(size=hidden, dropout_input=0.1, dropout_output=0.4)
  return c
