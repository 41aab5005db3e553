"""The reverse copy task (Mogrifier paper, section 4.3) and an encoder-decoder for it.

An encoder reads `length` tokens drawn uniformly from a vocabulary; the decoder
starts from the encoder's last state, reads a marker and then its own previous
targets (teacher forcing), and must emit the sequence reversed.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import numpy as np

from lm_zoo.cells import LSTMCell
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
      idx = order[start:start + batch_size]
      yield self.encoder_inputs[idx], self.decoder_inputs[idx], self.targets[idx]


def reverse_copy_data(num_examples: int, length: int, vocab_size: int,
                      seed: int) -> ReverseCopyData:
  """`num_examples` sequences of `length` tokens uniform over `vocab_size`."""
  if num_examples < 1 or length < 1 or vocab_size < 2:
    raise ValueError('reverse copy needs num_examples >= 1, length >= 1 and '
                     f'vocab_size >= 2, got {num_examples}, {length}, {vocab_size}')
  source = np.random.default_rng(seed).integers(
      0, vocab_size, (num_examples, length)).astype(np.int32)
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
    x = nn.Embed(self.vocab_size + 1, self.embed_size, name='encoder_embed')(
        encoder_inputs.T)
    carry, _ = RecurrentLayer(encoder, name='encoder')(carry, x)
    y = nn.Embed(self.vocab_size + 1, self.embed_size, name='decoder_embed')(
        decoder_inputs.T)
    _, h = RecurrentLayer(decoder, name='decoder')(carry, y)
    return nn.Dense(self.vocab_size, name='softmax')(h.transpose(1, 0, 2))
