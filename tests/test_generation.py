"""Sampling: reproducible with a seed, and distributed as the model says."""

import jax
import numpy as np
import pytest

from lm_zoo.generation import sample
from lm_zoo.models import RecurrentLM, init_params


@pytest.fixture(scope='module')
def lm():
  model = RecurrentLM(vocab_size=7, embed_size=4, hidden_sizes=(5,))
  return model, init_params(model, jax.random.key(0))


def test_same_seed_same_text(lm):
  model, params = lm
  prompt = np.array([[1, 2], [3, 4]])
  a = sample(model, params, prompt, 12, jax.random.key(5))
  b = sample(model, params, prompt, 12, jax.random.key(5))
  c = sample(model, params, prompt, 12, jax.random.key(6))
  assert a.shape == (2, 12) and a.min() >= 0 and a.max() < 7
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_first_token_follows_the_softmax(lm):
  model, params = lm
  prompt = np.full((4000, 1), 2)
  logits, _ = model.apply({'params': params}, prompt[:1], model.initialize_carry(1))
  for temperature in (1.0, 0.5):
    probs = np.asarray(jax.nn.softmax(logits[0, -1] / temperature))
    first = sample(model, params, prompt, 1, jax.random.key(0), temperature)[:, 0]
    freq = np.bincount(first, minlength=7) / len(first)
    np.testing.assert_allclose(freq, probs, atol=0.03)


def test_bad_arguments(lm):
  model, params = lm
  with pytest.raises(ValueError, match='temperature'):
    sample(model, params, np.ones((1, 1)), 3, jax.random.key(0), temperature=0)
  with pytest.raises(ValueError, match='prompt'):
    sample(model, params, np.ones((3,)), 3, jax.random.key(0))
