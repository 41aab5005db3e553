"""The aLSTM paper's robustness study (section 5.6) at a size that trains on 2
CPU cores: LSTM against the aLSTM (LSTM adaptation model) of
`ptb_alstm_small.py`, 3M parameters each, dropout rates drawn uniformly from
[r - 0.1, r + 0.1] around the recipe's rates r (input .4, hidden .2, state
.1, output .4), every other hyper-parameter fixed.

The paper: 100 draws per model, 10 PTB epochs, each model's own tuned rates.
Here: `num_samples` draws shared by both models (paired), 1 epoch, the same
rates r for both.

  lm-zoo-task \
      --config=experiments/alstm_robustness.py --output=runs/alstm_robustness.json
"""

import ml_collections

from lm_zoo.experiments.recipes import small_ptb_config


def _model(cell: str) -> ml_collections.ConfigDict:
  c = small_ptb_config()
  c.train.num_epochs = 1
  c.generate.num_lines = 0
  if cell == 'alstm':
    c.model.cell = 'alstm'
    c.model.alstm.update(latent='lstm', latent_size=100)
  return c


def get_config():
  c = ml_collections.ConfigDict()
  c.task = 'robustness'
  c.models = ml_collections.ConfigDict({'lstm': _model('lstm'), 'alstm': _model('alstm')})
  c.rates = ('dropout_input', 'dropout_hidden', 'dropout_state', 'dropout_output')
  c.radius = 0.1
  c.num_samples = 3  # the paper: 100
  c.seed = 0
  c.workdir = 'runs/alstm_robustness'
  return c
