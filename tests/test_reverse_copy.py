"""The reverse copy task: data as specified, and an encoder-decoder that learns it."""

import numpy as np
import pytest
from conftest import load_experiment

from lm_zoo.cells import LSTMCell, mogrified
from lm_zoo.tasks import (
  EncoderDecoder,
  fit,
  reverse_copy_data,
  run_experiment,
  sequence_cross_entropy,
)


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
  model = EncoderDecoder(vocab_size=6, embed_size=16, hidden_size=32, decoder_cell=decoder_cell)
  # 8 epochs: at 6 the Mogrifier was at the edge of learning the task (accuracy
  # 0.925 with jax 0.10.2 / flax 0.12.8 / optax 0.2.8, above 0.95 with earlier versions).
  params = fit(model, data, learning_rate=1e-2, batch_size=64, epochs=8, seed=0)
  test = reverse_copy_data(256, 4, 6, seed=2)
  cross_entropy, accuracy = sequence_cross_entropy(model, params, test)
  assert accuracy > 0.95 and cross_entropy < 0.2


def test_the_configs_models_build_at_its_sizes():
  """experiments/reverse_copy.py as documented: every model is checked at the
  config's own sizes before any data is built (no length: nothing trained)."""
  config = load_experiment('reverse_copy')
  config.lengths = ()
  assert run_experiment(config) == []


@pytest.mark.slow  # the whole experiment at tiny sizes; the task and models have fast tests above
def test_experiment_reports_every_length_and_model():
  config = load_experiment('reverse_copy')
  config.update(lengths=(2, 3), num_train=128, num_test=32, hidden_size=8, epochs=1)
  rows = run_experiment(config)
  assert [(r['length'], r['model']) for r in rows] == [
    (2, 'lstm'),
    (2, 'mogrifier'),
    (3, 'lstm'),
    (3, 'mogrifier'),
  ]
  assert all(0 < r['cross_entropy'] < 10 and 0 <= r['accuracy'] <= 1 for r in rows)
