"""A tiny language model and its compiled application, shared by the tests
of the language model (test_language_model.py) and of its stack
(test_stacks.py)."""

from functools import partial

import jax
import numpy as np

from lm_zoo.cells import LSTMCell
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack


def tiny_lm(sizes=(5, 4), make_cell=LSTMCell, embedding=None, head=None, bridge=None, **stack):
  """31 token types embedded in 6 dimensions, a layer of each size, a softmax."""
  return RecurrentLM(
    embedding or Embedding(31, 6),
    Stack([make_cell(n) for n in sizes], **stack),
    head or Softmax(31),
    bridge,
  )


# Run op by op, each of these would compile every operation of the model on its
# own; jitted with the model static, equal models of equal shapes compile once
# in the whole session.
@partial(jax.jit, static_argnames=('model', 'train', 'mutable'))
def apply_lm(model, params, tokens, carries=None, train=False, dropout_key=None, mutable=False):
  """model.apply on `tokens` from `carries` (the zero state if None)."""
  if carries is None:
    carries = model.initialize_carry(tokens.shape[0])
  rngs = {'dropout': dropout_key} if train else None
  return model.apply({'params': params}, tokens, carries, train=train, rngs=rngs, mutable=mutable)


def projected(params, h):
  """h @ W^T + b of the untied softmax, in NumPy."""
  return np.asarray(h) @ np.asarray(params['head']['kernel']).T + np.asarray(params['head']['bias'])
