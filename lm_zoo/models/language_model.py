"""The recurrent language model, from parts: embedding -> stack -> (bridge)
-> head, each a child module."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells import dropout_scaled
from lm_zoo.models.heads import Dual, MixtureHead, Softmax, TiedSoftmax
from lm_zoo.models.stacks import LSTMRHN, Stack


def symmetric_uniform(scale: float) -> Callable[..., jax.Array]:
  """Initialiser drawing from U(-scale, scale)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)

  return init


def _at_least_float32(x: jax.Array) -> jax.Array:
  """Logits in float32 or wider (float64 stays, for finite-difference checks)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class Embedding(nn.Module):
  """The token embedding E (V, d) and its two dropouts:

    e_t = (D_words(E))[w_t],  x_t = D(e_t)

  `dropout_words` drops whole words, rows of E with one mask per call
  shared by a word's every occurrence, and `dropout` the embedded vectors
  that feed the stack (one mask per window when `variational`, else per
  step). Its one parameter is `embedding` (V, d).

    >>> embedding = Embedding(vocab_size=50, features=8, dropout=0.3)
    >>> e, x, table = embedding.apply(variables, ids, train=False)  # ids (T, B)

  Attributes:
    vocab_size: number of token types V.
    features: the embedding size d.
    dropout_words, dropout: rates.
    variational: share `dropout`'s mask over time.
    embedding_init: initialiser of E.
    dtype: the embedded vectors' dtype (None: the parameters').
  """

  vocab_size: int
  features: int
  dropout_words: float = 0.0
  dropout: float = 0.0
  variational: bool = True
  embedding_init: Callable[..., jax.Array] = symmetric_uniform(0.1)
  dtype: Any = None

  dropout_rates: ClassVar[tuple[str, ...]] = ('dropout_words', 'dropout')

  @nn.compact
  def __call__(self, ids: jax.Array, *, train: bool):
    """ids (T, B) -> (e (T, B, d) after word dropout, e after `dropout` for
    the stack, the embedding matrix E (V, d))."""
    table = self.param('embedding', self.embedding_init, (self.vocab_size, self.features))
    dtype = self.dtype or table.dtype
    if train and self.dropout_words > 0:
      # One mask entry per word type, shared by its every occurrence (V, 1).
      rows = nn.Dropout(
        self.dropout_words, broadcast_dims=(1,), deterministic=False, name='word_dropout'
      )(table)
      e = jnp.take(rows, ids, axis=0).astype(dtype)
    else:
      e = jnp.take(table.astype(dtype), ids, axis=0)  # as nn.Embed looks up
    x = nn.Dropout(
      self.dropout,
      broadcast_dims=(0,) if self.variational else (),
      deterministic=not train,
      name='embedded_dropout',
    )(e)
    return e, x, table


class RecurrentLM(nn.Module):
  """A language model from parts, each a child module:

    e, x = embedding(w);  h = stack(x);  h = bridge(e, h);  logits = head(h, E)

  Any `nn.RNNCellBase` can be a layer of the stack (`Stack`, or the aLSTM's
  `LSTMRHN`); the bridge is the dual connection (`Dual`) or none; the head
  is `Softmax`, `TiedSoftmax` (the embedding matrix E as the softmax
  weights) or `MixtureHead` (normalised log-probabilities in place of
  logits). Every dropout is off at evaluation (`train=False`); with
  `train=True` and a rate above zero, `apply` needs a 'dropout' RNG.
  `build_model` assembles the parts from a config.

    >>> model = RecurrentLM(Embedding(50, 8), Stack([LSTMCell(8)]), Softmax(50))
    >>> params = init_params(model, jax.random.key(0))
    >>> logits, carries = model.apply({'params': params}, tokens, model.initialize_carry(4))

  The parameters, under the parts' names:

    embedding/embedding          E (V, d)
    stack/cell_{i}/...           layer i's cell (an LSTM's input/kernel,
                                 input/bias, recurrent_kernel)
    bridge/dense/{kernel,bias}   the dual connection, with a bridge
    head/kernel, head/bias       Softmax: W (V, n) and b
    head/projection/kernel       TiedSoftmax: P (n, d) when n != d; head/bias
    head/prior/kernel, head/latent/{kernel,bias}, head/softmax/kernel
                                 MixtureHead (no head/softmax when tied);
                                 head/bias

  The stack's undropped and dropped output is sown into 'intermediates' as
  `stack/output` and `stack/dropped_output`, for AR and TAR.

  Besides `init` and `apply`, callers (the train and evaluation steps,
  generation, dynamic evaluation) use `vocab_size`, `initialize_carry`,
  `dropped_weights` (weight drop: training and MC dropout apply the model to
  `model.dropped_weights(params, rng)`, one mask per forward pass; the
  parameters unchanged without weight drop) and `with_dropout_scaled`.

  Attributes:
    embedding: the token embedding and its dropouts (`Embedding`).
    stack: the recurrent layers (`Stack` or `LSTMRHN`).
    head: the output layer (`Softmax`, `TiedSoftmax` or `MixtureHead`).
    bridge: between the stack and the head (`Dual`), or None.
  """

  embedding: Embedding
  stack: Stack | LSTMRHN
  head: Softmax | TiedSoftmax | MixtureHead
  bridge: Dual | None = None

  @property
  def vocab_size(self) -> int:
    return self.head.vocab_size

  @nn.nowrap
  def initialize_carry(self, batch_size: int, rng: jax.Array | None = None) -> list[Any]:
    """The zero state of every layer for `batch_size` parallel streams."""
    return self.stack.initialize_carry(batch_size, self.embedding.features, rng)

  @nn.nowrap
  def dropped_weights(self, params: Any, rng: jax.Array) -> Any:
    """`params` with the stack's weight drop applied to `params['stack']`
    (unchanged without)."""
    stack = self.stack.dropped_weights(params['stack'], rng)
    return params if stack is params['stack'] else {**params, 'stack': stack}

  @nn.nowrap
  def with_dropout_scaled(self, factor: float) -> 'RecurrentLM':
    """This model with every dropout rate of its parts and cells (weight drop
    included) multiplied by `factor`: MC dropout's rate multiplier.

    Raises:
      ValueError: a scaled rate leaves [0, 1), naming it.
    """
    return dropout_scaled(self, factor)

  @nn.compact
  def __call__(
    self,
    tokens: jax.Array,
    carries: Sequence[Any],
    *,
    train: bool = False,
    steps: jax.Array | None = None,
  ) -> tuple[jax.Array, list[Any]]:
    """tokens (B, T) int; returns logits (B, T, V) and the new carries.
    `steps`, (T,) bool, marks the window's own steps, first: the carries are
    those after them, as if the window ended there (a window padded to a
    shared length; `lm_zoo.cells.held_steps`)."""
    if tokens.ndim != 2:
      raise ValueError(f'tokens must be (batch, time), got shape {tokens.shape}')
    if self.embedding.vocab_size != self.head.vocab_size:
      raise ValueError(
        f'the embedding has {self.embedding.vocab_size} token types and the '
        f'head {self.head.vocab_size}: give both one vocab_size'
      )
    # Time-major (T, B) for the scans.
    embedded, x, table = self.embedding(tokens.T, train=train)
    new_carries, h = self.stack(carries, x, train=train, steps=steps)
    if self.bridge is not None:
      h = self.bridge(embedded, h, train=train)
    logits = self.head(h.transpose(1, 0, 2), table, train=train)
    return _at_least_float32(logits), new_carries
