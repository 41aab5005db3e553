"""The reverse copy task (Mogrifier paper, section 4.3) and an encoder-decoder for it.

An encoder reads `length` tokens drawn uniformly from a vocabulary; the decoder
starts from the encoder's last state, reads a marker and then its own previous
targets (teacher forcing), and must emit the sequence reversed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lm_zoo.cells import LSTMCell, mogrified
from lm_zoo.errors import ConfigError
from lm_zoo.models.recurrent import RecurrentLayer


@dataclasses.dataclass(frozen=True)
class ReverseCopyData:
  """(N, length) int32 arrays; token ids are 0..vocab_size-1, the marker is vocab_size."""

  encoder_inputs: np.ndarray
  decoder_inputs: np.ndarray
  targets: np.ndarray
  vocab_size: int

  @property
  def marker(self) -> int:
    return self.vocab_size

  def batches(self, batch_size: int, rng: np.random.Generator):
    """Shuffled batches of (encoder_inputs, decoder_inputs, targets), one pass."""
    order = rng.permutation(len(self.targets))
    for start in range(0, len(order) - batch_size + 1, batch_size):
      idx = order[start : start + batch_size]
      yield self.encoder_inputs[idx], self.decoder_inputs[idx], self.targets[idx]


def reverse_copy_data(
  num_examples: int, length: int, vocab_size: int, seed: int
) -> ReverseCopyData:
  """`num_examples` sequences of `length` tokens uniform over `vocab_size`."""
  if num_examples < 1 or length < 1 or vocab_size < 2:
    raise ValueError(
      'reverse copy needs num_examples >= 1, length >= 1 and '
      f'vocab_size >= 2, got {num_examples}, {length}, {vocab_size}'
    )
  source = (
    np.random.default_rng(seed).integers(0, vocab_size, (num_examples, length)).astype(np.int32)
  )
  targets = source[:, ::-1].copy()
  marker = np.full((num_examples, 1), vocab_size, np.int32)
  decoder_inputs = np.concatenate([marker, targets[:, :-1]], axis=1)
  return ReverseCopyData(source, decoder_inputs, targets, vocab_size)


class EncoderDecoder(nn.Module):
  """Independent encoder and decoder cells; the decoder starts from the
  encoder's last carry. Any `nn.RNNCellBase` factories work for either.

  Attributes:
    vocab_size: content tokens (the marker is one more symbol).
    embed_size: size of each side's own embedding.
    hidden_size: cell size of both sides.
    encoder_cell, decoder_cell: build a cell from `features=`.
  """

  vocab_size: int
  embed_size: int
  hidden_size: int
  encoder_cell: Callable[..., nn.RNNCellBase] = LSTMCell
  decoder_cell: Callable[..., nn.RNNCellBase] = LSTMCell

  @nn.compact
  def __call__(self, encoder_inputs: jax.Array, decoder_inputs: jax.Array) -> jax.Array:
    """(B, L) and (B, L) ids -> decoder logits (B, L, vocab_size)."""
    batch = encoder_inputs.shape[0]
    encoder = self.encoder_cell(features=self.hidden_size, parent=None)
    decoder = self.decoder_cell(features=self.hidden_size, parent=None)
    carry = encoder.initialize_carry(jax.random.key(0), (batch, self.embed_size))
    x = nn.Embed(self.vocab_size + 1, self.embed_size, name='encoder_embed')(encoder_inputs.T)
    carry, _ = RecurrentLayer(encoder, name='encoder')(carry, x)
    y = nn.Embed(self.vocab_size + 1, self.embed_size, name='decoder_embed')(decoder_inputs.T)
    _, h = RecurrentLayer(decoder, name='decoder')(carry, y)
    return nn.Dense(self.vocab_size, name='softmax')(h.transpose(1, 0, 2))


def sequence_cross_entropy(
  model: EncoderDecoder, params, data: ReverseCopyData, batch_size: int = 256
) -> tuple[float, float]:
  """Mean per-token cross-entropy (nats) and accuracy of `model` on `data`."""
  apply = jax.jit(model.apply)
  total = correct = 0.0
  for start in range(0, len(data.targets), batch_size):
    sl = slice(start, start + batch_size)
    logits = apply(params, data.encoder_inputs[sl], data.decoder_inputs[sl])
    targets = data.targets[sl]
    total += float(optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum())
    correct += float((logits.argmax(-1) == targets).sum())
  return total / data.targets.size, correct / data.targets.size


def fit(
  model: EncoderDecoder,
  train: ReverseCopyData,
  *,
  learning_rate: float = 3e-3,
  l2: float = 0.0,
  batch_size: int = 64,
  epochs: int = 1,
  clip_norm: float = 10.0,
  seed: int = 0,
):
  """Trains `model` with teacher forcing (Adam, beta1 = 0 as in the paper's setup).

  Returns the trained parameters.
  """
  params = model.init(jax.random.key(seed), train.encoder_inputs[:1], train.decoder_inputs[:1])
  tx = optax.chain(
    optax.clip_by_global_norm(clip_norm),
    optax.add_decayed_weights(l2),
    optax.adam(learning_rate, b1=0.0),
  )
  opt_state = tx.init(params)

  def loss_fn(params, enc, dec, tgt):
    logits = model.apply(params, enc, dec)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, enc, dec, tgt):
    grads = jax.grad(loss_fn)(params, enc, dec, tgt)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  rng = np.random.default_rng(seed)
  for _ in range(epochs):
    for batch in train.batches(batch_size, rng):
      params, opt_state = step(params, opt_state, *batch)
  return params


def _checked_model(config, name: str) -> EncoderDecoder:
  """The encoder-decoder of `config.models[name]`, its shapes checked before
  any data is built: a size its layers refuse is a ConfigError naming it."""
  spec = config.models[name]
  cell = mogrified(LSTMCell, spec.rounds, spec.rank) if spec.rounds > 0 else LSTMCell
  model = EncoderDecoder(
    config.vocab_size, spec.embed_size, config.hidden_size, encoder_cell=cell, decoder_cell=cell
  )
  ids = jnp.zeros((1, 1), jnp.int32)
  try:
    jax.eval_shape(model.init, jax.random.key(0), ids, ids)
  except ValueError as err:
    raise ConfigError(f'config.models.{name}: {err}') from None
  return model


def run_experiment(config) -> list[dict]:
  """Cross-entropy against sequence length for each model of `config.models`.

  `config` (experiments/reverse_copy.py): lengths, models (name -> embed_size,
  mogrifier rounds and rank), vocab_size, hidden_size, num_train, num_test,
  learning_rate, l2, batch_size, epochs, seed.
  """
  models = {name: _checked_model(config, name) for name in config.models}
  rows = []
  for length in config.lengths:
    train = reverse_copy_data(config.num_train, length, config.vocab_size, config.seed)
    test = reverse_copy_data(config.num_test, length, config.vocab_size, config.seed + 1)
    for name, model in models.items():
      params = fit(
        model,
        train,
        learning_rate=config.learning_rate,
        l2=config.l2,
        batch_size=config.batch_size,
        epochs=config.epochs,
        seed=config.seed,
      )
      cross_entropy, accuracy = sequence_cross_entropy(model, params, test)
      rows.append(
        {'length': length, 'model': name, 'cross_entropy': cross_entropy, 'accuracy': accuracy}
      )
  return rows
