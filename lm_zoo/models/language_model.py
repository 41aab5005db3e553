"""The recurrent language model: embedding -> recurrent stack -> softmax."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells import LSTMCell, LSTMRHNStack
from lm_zoo.layers import DualConnection, MixtureOfSoftmaxes, OutputEmbedding
from lm_zoo.layers.products import attend, dense
from lm_zoo.models.recurrent import RecurrentLayer, RecurrentStack
from lm_zoo.models.regularisation import drop_recurrent_weights


def symmetric_uniform(scale: float) -> Callable[..., jax.Array]:
  """Initialiser drawing from U(-scale, scale)."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)
  return init


def _at_least_float32(x: jax.Array) -> jax.Array:
  """Logits in float32 or wider (float64 stays, for finite-difference checks)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class RecurrentLM(nn.Module):
  """Embedding -> stacked recurrent layers -> (projection) -> softmax logits.

  Any `nn.RNNCellBase` can be a layer: `cell_factory(features=n)` builds the
  cell of each layer. Embedding dropout (`dropout_embedding`) drops whole
  words: rows of the embedding matrix, one mask per call. Dropout applies to
  the embedding output
  (`dropout_input`), between layers (`dropout_hidden`), to each layer's
  fed-back state (`dropout_state`) and to the final output (`dropout_output`);
  none at evaluation. Its masks are shared over time (variational, Gal &
  Ghahramani 2016); `variational_dropout=False` draws a new mask at every step
  for the non-recurrent connections (Zaremba et al. 2014). With tied embeddings the softmax
  weights are the embedding matrix, and a linear projection maps the last
  layer to the embedding size when the two differ.

  Weight drop (`weight_drop`, DropConnect on every hidden-to-hidden matrix)
  acts on the parameters, not inside the call: training applies the model to
  `model.dropped_weights(params, rng)`, which draws one mask per forward pass.

  The dual connection (`dual_size`) feeds the softmax ReLU(W_d [e_t; h_t] + b_d)
  of the embedded word e_t (after whole-word dropout) and the stack's dropped
  output h_t. With a mixture of softmaxes (`mos_components`) the model
  returns normalised log-probabilities in place of logits; every loss and
  sampler reads them the same way.

  The last layer's output is sown into the 'intermediates' collection as
  `output` (undropped) and `dropped_output`, for AR and TAR.

  With `skip_connections` the stack's output is the sum of every layer's
  undropped output (lamb's `lstm_skip_connection`; layers of one size).

  With `lstm_rhn` the layers (aLSTM cells with recurrent adaptation models)
  are stepped together as the LSTM-RHN of the aLSTM paper's eq. (9) instead
  of one after another; its dropout is always variational.

  Attributes:
    vocab_size: number of token types.
    embed_size: embedding size.
    hidden_sizes: each recurrent layer's size.
    cell_factory: builds one layer's cell from `features=`.
    tie_embeddings: share the embedding with the softmax.
    dropout_embedding: rate of whole-word dropout on the embedding matrix.
    dropout_input, dropout_hidden, dropout_state, dropout_output: rates.
    weight_drop: DropConnect rate on the recurrent matrices (see above).
    variational_dropout: one mask per window for every dropout (else per step,
      except on the state).
    embed_init: initialiser of the embedding.
    unroll: scan unroll of the recurrent layers.
    fused_recurrence: run cells that offer `scan_window` (`LSTMCell`,
      `Mogrify(LSTMCell)`) over a window with their hand-written backward
      pass (batched weight gradients); False differentiates the plain scan.
    remat: recompute each time step in the backward pass from its input and
      carry instead of storing its activations (a third of the memory for
      long BPTT windows, at the cost of a second, slower forward pass).
    dtype: computation dtype of the embedding output and of the products
      of the projection, the dual layer and the softmax or mixture (the
      cells take theirs from `cell_factory`); None computes in the
      parameters' dtype. With bfloat16 those products take bfloat16
      operands and sum in float32 (`lm_zoo.layers.products`). Logits are
      always float32 or wider.
    skip_connections: the stack returns the sum of its layers' outputs.
    lstm_rhn: wire the layers as `LSTMRHNStack` (aLSTM cells only).
    dual_size: > 0 adds the dual connection of that size (`DualConnection`)
      between the stack and the softmax; 0 is the ERS architecture.
    dropout_dual_input, dropout_dual_output: the dual layer's dropout rates.
    mos_components: > 0 replaces the softmax by a mixture of that many
      softmaxes (`MixtureOfSoftmaxes`, latents of the embedding size, E tied
      to the embedding when `tie_embeddings`); 0 is one softmax.
    dropout_mos_latent: dropout rate on the mixture's latents.
  """

  vocab_size: int
  embed_size: int
  hidden_sizes: Sequence[int]
  cell_factory: Callable[..., nn.RNNCellBase] = LSTMCell
  tie_embeddings: bool = False
  dropout_embedding: float = 0.0
  dropout_input: float = 0.0
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  dropout_output: float = 0.0
  weight_drop: float = 0.0
  variational_dropout: bool = True
  embed_init: Callable[..., jax.Array] = symmetric_uniform(0.1)
  unroll: int = 1
  fused_recurrence: bool = True
  remat: bool = False
  dtype: Any = None
  skip_connections: bool = False
  lstm_rhn: bool = False
  dual_size: int = 0
  dropout_dual_input: float = 0.0
  dropout_dual_output: float = 0.0
  mos_components: int = 0
  dropout_mos_latent: float = 0.0

  @nn.nowrap
  def initialize_carry(self, batch_size: int, rng: jax.Array | None = None) -> list[Any]:
    """The zero state of every layer for `batch_size` parallel streams."""
    rng = jax.random.key(0) if rng is None else rng
    sizes = [self.embed_size, *self.hidden_sizes[:-1]]
    return [
        self.cell_factory(features=n, parent=None).initialize_carry(
            key, (batch_size, m))
        for key, m, n in zip(jax.random.split(rng, len(sizes)), sizes,
                             self.hidden_sizes)
    ]

  @nn.nowrap
  def dropped_weights(self, params: Any, rng: jax.Array) -> Any:
    """`params` with weight drop applied (identity when `weight_drop` is 0)."""
    return drop_recurrent_weights(params, self.weight_drop, rng)

  @nn.compact
  def __call__(self, tokens: jax.Array, carries: Sequence[Any], *,
               train: bool = False) -> tuple[jax.Array, list[Any]]:
    """tokens (B, T) int; returns logits (B, T, V) and the new carries."""
    if tokens.ndim != 2:
      raise ValueError(f'tokens must be (batch, time), got shape {tokens.shape}')
    embed = nn.Embed(self.vocab_size, self.embed_size, embedding_init=self.embed_init,
                     dtype=self.dtype, name='embed')
    ids = tokens.T  # time-major (T, B) for the scans
    if train and self.dropout_embedding > 0:
      # One mask entry per word type, shared by its every occurrence (V, 1).
      table = nn.Dropout(self.dropout_embedding, broadcast_dims=(1,),
                         deterministic=False)(embed.embedding)
      x = jnp.take(table, ids, axis=0).astype(self.dtype or table.dtype)
    else:
      x = embed(ids)
    embedded = x  # the dual connection's e_t, before the stack's input dropout
    time_shared = (0,) if self.variational_dropout else ()
    x = nn.Dropout(self.dropout_input, broadcast_dims=time_shared,
                   deterministic=not train)(x)
    cells = [self.cell_factory(features=n, name=f'cell_{i}')
             for i, n in enumerate(self.hidden_sizes)]
    if self.lstm_rhn:
      if self.skip_connections:
        raise ValueError('skip_connections do not apply to the LSTM-RHN stack (lstm_rhn), '
                         'which steps its layers together: set one of them False')
      rhn = LSTMRHNStack(cells, self.dropout_hidden, self.dropout_state,
                         deterministic=not train, name='lstm_rhn')
      new_carries, h = RecurrentLayer(rhn, unroll=self.unroll, name='stack')(
          tuple(carries), x)
      new_carries = list(new_carries)
    else:
      new_carries, h = RecurrentStack(
          cells, dropout_hidden=self.dropout_hidden,
          dropout_state=self.dropout_state,
          variational_dropout=self.variational_dropout, unroll=self.unroll,
          fused=self.fused_recurrence, remat=self.remat,
          skip_connections=self.skip_connections, name='stack')(carries, x, train=train)
    self.sow('intermediates', 'output', h)
    h = nn.Dropout(self.dropout_output, broadcast_dims=time_shared,
                   deterministic=not train)(h)
    self.sow('intermediates', 'dropped_output', h)
    if self.dual_size:
      h = DualConnection(self.dual_size, self.dropout_dual_input,
                         self.dropout_dual_output, broadcast_dims=time_shared,
                         dtype=self.dtype, name='dual')(embedded, h, deterministic=not train)
    h = h.transpose(1, 0, 2)  # batch-major from here: time is axis 1
    if self.mos_components:
      log_probs = MixtureOfSoftmaxes(
          self.vocab_size, self.mos_components, self.embed_size,
          dropout_latent=self.dropout_mos_latent,
          broadcast_dims=(1,) if self.variational_dropout else (),
          dtype=self.dtype, name='mos')(h, embed.embedding if self.tie_embeddings else None,
                      deterministic=not train)
      return _at_least_float32(log_probs), new_carries
    # The softmax's products on (B·T, features): XLA's CPU backend runs the
    # 2-d products and their gradients faster than 3-d ones.
    batch_time, h = h.shape[:2], h.reshape(-1, h.shape[-1])
    if self.tie_embeddings:
      if h.shape[-1] != self.embed_size:
        h = dense(self.embed_size, self.dtype, use_bias=False, name='projection')(h)
      bias = self.param('softmax_bias', nn.initializers.zeros_init(),
                        (self.vocab_size,))
      logits = attend(h, embed.embedding, self.dtype) + bias
    else:
      logits = OutputEmbedding(self.vocab_size, dtype=self.dtype, name='softmax')(h)
    return _at_least_float32(logits).reshape(*batch_time, -1), new_carries
