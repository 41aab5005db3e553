"""Reverse copy (Mogrifier paper section 4.3) at a size that trains on 2 CPU cores.

The paper: 500,000 training examples over a 1,000-token vocabulary, a 10M
parameter encoder-decoder, lengths 50..200, tuned learning rate / L2 /
embedding size (LSTM 498/787 vs Mogrifier 41/1054 embedding/hidden at 150
steps). Here: a 100-token vocabulary, hidden 128, lengths 10..40; the
Mogrifier gets a small embedding as the paper's tuner chose, and full-rank
matrices (at embedding 16 any rank of 16 or more factorises nothing).

  lm-zoo-task --config=experiments/reverse_copy.py \
      --output=runs/reverse_copy.json
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.task = 'reverse_copy'
  c.lengths = (10, 20, 30, 40)
  c.vocab_size = 100
  c.hidden_size = 128
  c.models = ml_collections.ConfigDict(
    {
      'lstm': {'embed_size': 64, 'rounds': 0, 'rank': 0},
      'mogrifier': {'embed_size': 16, 'rounds': 5, 'rank': 0},
    }
  )
  c.num_train = 20_000
  c.num_test = 1_000
  c.learning_rate = 3e-3
  c.l2 = 0.0
  c.batch_size = 64
  c.epochs = 3
  c.seed = 0
  return c
