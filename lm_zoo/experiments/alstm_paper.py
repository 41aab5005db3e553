"""The aLSTM on PTB or WikiText-2 as its authors ran it (Flennerhag et al.
2018), for accelerator hosts.

Every value is that of the command in flennerhag/alstm's `examples/README.md`
(PTB: valid 58.7, test 56.5; WikiText-2: 67.5 / 64.5) with the defaults of
`examples/main.py` for what the command leaves out:

  python main.py --model ALSTM --epochs 190 --emsize 400 --nhid 1150 --nlayers 2
      --npar 100 --dropouth 0.25 --dropoute 0.16 --dropouti 0.6 --dropouto 0.6
      --dropouta 0.1 --wdecay 1e-6 --var-seq --seq-len 70 --batch_size 20
      --cut-steps 100 160 --cut-rate 10 --save
  (WikiText-2: --epochs 187 --nhid 1500 --cut-steps 80 160 200)

Their 2-layer `aLSTM` always wires the adaptation models as the LSTM-RHN of
eq. (9). The parameters start as theirs: W and V each orthogonal over the
four gates, the rest torch's defaults (`model.init='torch'`). Where our
model still differs from their code (one dropout mask for a layer's output
and fed-back state there, two here; their policy slices overlap),
docs/differences.md says so.

  lm-zoo-train --config=experiments/alstm_paper.py:ptb --workdir=runs/alstm_ptb
  lm-zoo-train --config=experiments/alstm_paper.py:wikitext2 --workdir=runs/alstm_wt2
"""

from lm_zoo.configs import base_config

# corpus -> (--nhid, --epochs, --cut-steps); examples/README.md
RECIPES = {'ptb': (1150, 190, (100, 160)), 'wikitext2': (1500, 187, (80, 160, 200))}


def get_config(corpus: str = 'ptb'):
  if corpus not in RECIPES:
    raise ValueError(f'corpus must be one of {", ".join(RECIPES)}, got {corpus!r}')
  hidden, epochs, cuts = RECIPES[corpus]
  c = base_config()
  # --seq-len 70 --var-seq --batch_size 20; evaluation at 10 and 1 (main.py)
  c.data.update(
    name=corpus, batch_size=20, bptt=70, variable_bptt=True, eval_batch_size=10, test_batch_size=1
  )
  # --emsize 400 --nhid --nlayers 2 --npar 100; the last layer of the embedding
  # size, tied (main.py's --tied defaults to tying); aLSTM: LSTM-RHN adaptation.
  c.model.update(
    cell='alstm',
    num_layers=2,
    embed_size=400,
    hidden_size=hidden,
    output_size=400,
    tie_embeddings=True,
    dropout_embedding=0.16,  # --dropoute
    dropout_input=0.6,  # --dropouti
    dropout_hidden=0.25,
    dropout_state=0.25,  # --dropouth (dropout_alstm)
    dropout_output=0.6,
  )  # --dropouto
  c.model.alstm.update(latent='lstm_rhn', latent_size=100, dropout_latent=0.1)  # --dropouta
  # aLSTMCell.reset_parameters: torch's orthogonal_ on each whole (4n, .) matrix;
  # the adaptation LSTMCell and the policy's nn.Linear keep torch's defaults.
  c.model.alstm.orthogonal_per_gate = False
  c.model.init = 'torch'
  # Adam(betas=(0, 0.999), eps=1e-9, weight_decay=--wdecay), --lr 0.003, --clip 5
  # (main.py's default); torch's weight decay is added after the clipping.
  c.optimizer.update(
    name='adam', learning_rate=3e-3, beta1=0.0, beta2=0.999, eps=1e-9, clip_norm=5.0, l2=1e-6
  )
  # --cut-steps, --cut-rate 10: lr / 10 after those epochs
  c.schedule.update(kind='milestones', factor=0.1, milestones=cuts)
  c.train.update(num_epochs=epochs, log_every=200, checkpoint_every=2000)
  return c
