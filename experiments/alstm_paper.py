"""The aLSTM on PTB or WikiText-2 at the paper's settings (Flennerhag et al.
2018, section 5.3 / 5.4), for accelerator hosts.

2 layers, embedding 400, hidden 1150 with the last layer of the embedding
size as in AWD-LSTM, IO adaptation with an LSTM adaptation model of size 100,
tied embeddings, Adam lr
3e-3 with beta = (0, 0.999), weight decay 1e-6 (as an L2 penalty), variable
BPTT around 70, batch 20, 190 epochs, lr / 10 after epochs 100 and 160.
The paper's dropout rates and clipping are not restated in MODELS.md; the
values below are AWD-LSTM's and a starting point for tuning. Paper (PTB, 17M parameters):
valid 58.7, test 56.5.

  python launch/train.py --config=experiments/alstm_paper.py:ptb --workdir=runs/alstm_ptb
  python launch/train.py --config=experiments/alstm_paper.py:wikitext2 --workdir=runs/alstm_wt2

The paper's Table 4 ablation also wires the adaptation models across layers
(eq. 9, valid 58.5): add --config.model.alstm.latent=lstm_rhn.
"""

from lm_zoo.configs import base_config


def get_config(corpus: str = 'ptb'):
  if corpus not in ('ptb', 'wikitext2'):
    raise ValueError(f"corpus must be 'ptb' or 'wikitext2', got {corpus!r}")
  c = base_config()
  c.data.update(name=corpus, batch_size=20, bptt=70, variable_bptt=True,
                eval_batch_size=10)
  c.model.update(cell='alstm', num_layers=2, embed_size=400, hidden_size=1150,
                 output_size=400, tie_embeddings=True, dropout_input=0.4, dropout_hidden=0.25,
                 dropout_state=0.5, dropout_output=0.4)
  c.model.alstm.update(latent='lstm', latent_size=100)
  c.optimizer.update(name='adam', learning_rate=3e-3, beta1=0.0, beta2=0.999,
                     clip_norm=0.25, l2=1e-6)
  c.schedule.update(kind='milestones', factor=0.1, milestones=(100, 160))
  c.train.update(num_epochs=190, log_every=200, checkpoint_every=2000)
  return c
