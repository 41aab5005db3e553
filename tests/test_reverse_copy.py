"""The reverse copy task: data as specified, and an encoder-decoder that learns it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm_zoo.cells import LSTMCell, mogrified
from lm_zoo.tasks import EncoderDecoder, reverse_copy_data


def test_data_is_reversed_source_with_marker():
  data = reverse_copy_data(200, 7, 11, seed=0)
  assert data.encoder_inputs.shape == data.targets.shape == (200, 7)
  np.testing.assert_array_equal(data.targets, data.encoder_inputs[:, ::-1])
  np.testing.assert_array_equal(data.decoder_inputs[:, 0], 11)
  np.testing.assert_array_equal(data.decoder_inputs[:, 1:], data.targets[:, :-1])
  assert data.encoder_inputs.max() < 11 and data.encoder_inputs.min() >= 0
  counts = np.bincount(data.encoder_inputs.ravel(), minlength=11)
  assert counts.min() > 0.6 * counts.mean()  # uniform over the vocabulary
  again = reverse_copy_data(200, 7, 11, seed=0)
  np.testing.assert_array_equal(again.encoder_inputs, data.encoder_inputs)
  batches = list(data.batches(64, np.random.default_rng(0)))
  assert len(batches) == 3 and batches[0][0].shape == (64, 7)
  with pytest.raises(ValueError, match='vocab_size >= 2'):
    reverse_copy_data(10, 3, 1, seed=0)


@pytest.mark.parametrize('decoder', ['lstm', 'mogrifier'])
def test_encoder_decoder_learns_to_reverse(decoder):
  data = reverse_copy_data(2048, 4, 6, seed=1)
  decoder_cell = LSTMCell if decoder == 'lstm' else mogrified(LSTMCell, rounds=3, rank=4)
  model = EncoderDecoder(vocab_size=6, embed_size=16, hidden_size=32,
                         decoder_cell=decoder_cell)
  params = model.init(jax.random.key(0), data.encoder_inputs[:2], data.decoder_inputs[:2])
  tx = optax.adam(1e-2)
  opt_state = tx.init(params)

  def loss_fn(params, enc, dec, tgt):
    logits = model.apply(params, enc, dec)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()

  @jax.jit
  def step(params, opt_state, enc, dec, tgt):
    loss, grads = jax.value_and_grad(loss_fn)(params, enc, dec, tgt)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(0)
  for _ in range(6):
    for batch in data.batches(64, rng):
      params, opt_state, loss = step(params, opt_state, *batch)
  test = reverse_copy_data(256, 4, 6, seed=2)
  predicted = model.apply(params, test.encoder_inputs, test.decoder_inputs).argmax(-1)
  assert np.mean(predicted == test.targets) > 0.95
