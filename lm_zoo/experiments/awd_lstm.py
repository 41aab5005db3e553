"""AWD-LSTM (Merity et al. 2018) on PTB. Variants (`--config=...py:VARIANT`):

ptb     the paper's recipe, for accelerator hosts: 3 layers, embedding 400,
        hidden 1150 with the last layer of the embedding size, tied
        softmax; dropouts output .4, between layers .25, input .4,
        embedding .1, weight drop .5; two gate biases a layer and
        torch's initialisation, as the authors' LSTM has; AR 2, TAR 1;
        variable BPTT around 70, batch 20; SGD lr 30, clip 0.25, weight decay 1.2e-6; NT-ASGD
        (non-monotone interval 5), 500 epochs (paper: valid 60.0, test
        57.3 before fine-tuning, 24M parameters). Fine-tune afterwards:
        --config.train.init_from=runs/awd_ptb --config.averaging.trigger=always
small   the regularisers on the 2-epoch, 3M-parameter recipe of our small
        ablations (`lm_zoo.experiments.recipes.small_ptb_config`, Adam), compared with
        `ptb_mogrifier_ablation.py:lstm`, the same recipe without them:
        embedding dropout .1 and weight drop .5 in place of state dropout,
        AR 2, TAR 1.

lm-zoo-train --config=experiments/awd_lstm.py:small --workdir=runs/awd_small
"""

from lm_zoo.configs import base_config
from lm_zoo.experiments.recipes import small_ptb_config

VARIANTS = ('ptb', 'small')


def get_config(variant: str = 'small'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  if variant == 'small':
    c = small_ptb_config()
    c.model.update(dropout_embedding=0.1, weight_drop=0.5, dropout_state=0.0)
    c.optimizer.update(ar=2.0, tar=1.0)
    return c
  c = base_config()
  c.data.update(
    name='ptb', batch_size=20, bptt=70, variable_bptt=True, eval_batch_size=10, test_batch_size=1
  )
  c.model.update(
    num_layers=3,
    embed_size=400,
    hidden_size=1150,
    output_size=400,
    tie_embeddings=True,
    dropout_output=0.4,
    dropout_hidden=0.25,
    dropout_input=0.4,
    dropout_embedding=0.1,
    weight_drop=0.5,
    recurrent_bias=True,  # torch.nn.LSTM's bias_ih and bias_hh (model.py)
    init='torch',  # torch.nn.LSTM's U(±1/√n), no forget offset; init_weights()'s U(±0.1)
  )
  c.optimizer.update(name='sgd', learning_rate=30.0, clip_norm=0.25, l2=1.2e-6, ar=2.0, tar=1.0)
  c.averaging.update(trigger='nonmonotone', nonmono=5)
  c.train.update(num_epochs=500, log_every=200, checkpoint_every=2000)
  return c
