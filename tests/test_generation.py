"""Sampling: reproducible with a seed, and distributed as the model says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.cells import LSTMCell
from lm_zoo.data import Vocab
from lm_zoo.generation import (
  beam_search,
  encode_prompt,
  generate_text,
  greedy,
  sample,
  top_k_logits,
)
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params


@pytest.fixture(scope='module')
def lm():
  model = RecurrentLM(Embedding(7, 4), Stack([LSTMCell(5)]), Softmax(7))
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


@pytest.fixture(scope='module')
def skewed_lm(lm):
  """`lm` whose next-token probabilities are far from uniform (its head's
  bias from 0.4 down to 0.02): a sampler that ignores the logits, the
  temperature or the renormalisation of the top k misses by many standard
  deviations of the frequencies below."""
  model, params = lm
  bias = np.log([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02], dtype=np.float32)
  return model, {**params, 'head': {**params['head'], 'bias': bias}}


def _assert_drawn_from(first: np.ndarray, probs: np.ndarray) -> None:
  """The frequencies of `first` are within 4.5 binomial standard deviations
  of `probs`, for each token."""
  freq = np.bincount(first, minlength=len(probs)) / len(first)
  sigma = np.sqrt(probs * (1 - probs) / len(first))
  assert np.all(np.abs(freq - probs) <= 4.5 * sigma + 1e-12), (freq, probs)


def _first_logits(model, params, token: int) -> np.ndarray:
  logits, _ = model.apply({'params': params}, np.array([[token]]), model.initialize_carry(1))
  return np.asarray(logits[0, -1], np.float64)


def test_first_token_follows_the_softmax(skewed_lm):
  model, params = skewed_lm
  prompt = np.full((4000, 1), 2)
  logits = _first_logits(model, params, 2)
  for temperature in (1.0, 0.5):
    probs = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
    _assert_drawn_from(
      sample(model, params, prompt, 1, jax.random.key(0), temperature)[:, 0], probs
    )


def test_bad_arguments(lm):
  model, params = lm
  with pytest.raises(ValueError, match='temperature'):
    sample(model, params, np.ones((1, 1)), 3, jax.random.key(0), temperature=0)
  with pytest.raises(ValueError, match='prompt'):
    sample(model, params, np.ones((3,)), 3, jax.random.key(0))
  prompt, key = np.ones((1, 2)), jax.random.key(0)
  for top_k in (True, 1.5, -1):
    with pytest.raises(ValueError, match='top_k'):
      sample(model, params, prompt, 3, key, top_k=top_k)
  for temperature in ('hot', True, np.ones(2), -1.0):
    with pytest.raises(ValueError, match='temperature'):
      sample(model, params, prompt, 3, key, temperature=temperature)
  for temperature in (np.float32(0.8), jnp.float32(0.8), np.array(0.8)):  # scalars of any kind
    assert sample(model, params, prompt, 3, key, temperature=temperature).shape == (1, 3)
  assert sample(model, params, prompt, 0, key).shape == greedy(model, params, prompt, 0).shape
  assert greedy(model, params, prompt, 0).shape == (1, 0)
  for num_tokens in (-1, 2.0, True):
    with pytest.raises(ValueError, match='num_tokens'):
      sample(model, params, prompt, num_tokens, key)
    with pytest.raises(ValueError, match='num_tokens'):
      greedy(model, params, prompt, num_tokens)
    with pytest.raises(ValueError, match='num_tokens'):
      beam_search(model, params, prompt, num_tokens, 2)
  for width in (0, 10_000, True):
    with pytest.raises(ValueError, match='beam_width'):
      beam_search(model, params, prompt, 3, width)
  # Two prompts are not one: beam search continues a single row.
  for many in (np.ones((2, 2)), np.ones((1, 1, 2))):
    with pytest.raises(ValueError, match='one row'):
      beam_search(model, params, many, 3, 2)


def _sequence_log_prob(model, params, prompt, continuations):
  """log p(continuation | prompt) of each row of `continuations` (N, L) or
  of one (L,), by running the model over prompt and continuation at once."""
  rows = np.atleast_2d(continuations)
  tokens = np.concatenate([np.tile(prompt, (len(rows), 1)), rows], 1).astype(np.int32)
  logits, _ = model.apply({'params': params}, tokens, model.initialize_carry(len(rows)))
  logits = np.asarray(logits, np.float64)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  steps = np.arange(len(prompt) - 1, tokens.shape[1] - 1)
  targets = tokens[:, steps + 1, None]
  scores = np.take_along_axis(log_p[:, steps], targets, -1).sum((1, 2))
  return scores if np.ndim(continuations) == 2 else scores[0]


@pytest.fixture(scope='module')
def peaked_lm():
  """A bigger random model, with logits scaled so that decoders disagree."""
  model = RecurrentLM(Embedding(13, 6), Stack([LSTMCell(8)]), Softmax(13))
  params = init_params(model, jax.random.key(3))
  params['head']['kernel'] = params['head']['kernel'] * 8
  return model, params


def test_beam_width_one_is_greedy_and_temperature_near_zero_is_argmax(peaked_lm):
  model, params = peaked_lm
  prompt = np.array([1, 4, 2])
  best = greedy(model, params, prompt[None], 10)[0]
  beam, score = beam_search(model, params, prompt, 10, beam_width=1)
  np.testing.assert_array_equal(beam, best)
  np.testing.assert_allclose(score, _sequence_log_prob(model, params, prompt, best), rtol=1e-4)
  cold = sample(model, params, np.tile(prompt, (4, 1)), 10, jax.random.key(0), temperature=1e-4)
  np.testing.assert_array_equal(cold, np.tile(best, (4, 1)))
  top1 = sample(model, params, prompt[None], 10, jax.random.key(1), top_k=1)[0]
  np.testing.assert_array_equal(top1, best)


def test_wider_beams_find_likelier_sequences_and_score_them_right(peaked_lm):
  model, params = peaked_lm
  prompt = np.array([3])
  scores = []
  for width in (1, 3, 13):
    tokens, score = beam_search(model, params, prompt, 6, beam_width=width)
    np.testing.assert_allclose(score, _sequence_log_prob(model, params, prompt, tokens), rtol=1e-4)
    scores.append(score)
  assert scores[0] <= scores[1] + 1e-5 and scores[0] <= scores[2] + 1e-5
  # Width = vocab size on 2 steps is exhaustive: the best of all 13 x 13 pairs.
  tokens, score = beam_search(model, params, prompt, 2, beam_width=13)
  pairs = np.stack(np.meshgrid(np.arange(13), np.arange(13)), -1).reshape(-1, 2)
  every = _sequence_log_prob(model, params, prompt, pairs).max()
  np.testing.assert_allclose(score, every, rtol=1e-5)


def test_beam_search_stops_at_eos(peaked_lm):
  model, params = peaked_lm
  prompt = np.array([3])
  free, _ = beam_search(model, params, prompt, 8, beam_width=3)
  eos = int(free[2])  # a token the search emits: make it the end of sentence
  tokens, score = beam_search(model, params, prompt, 8, beam_width=3, eos_id=eos)
  end = list(tokens).index(eos)
  assert (tokens[end:] == eos).all()
  np.testing.assert_allclose(
    score, _sequence_log_prob(model, params, prompt, tokens[: end + 1]), rtol=1e-4
  )


def test_top_k_draws_from_the_renormalised_top_k(skewed_lm):
  model, params = skewed_lm
  prompt = np.full((4000, 1), 2)
  logits = _first_logits(model, params, 2)
  top = np.argsort(logits)[-3:]
  probs = np.zeros(7)
  probs[top] = np.exp(logits[top]) / np.exp(logits[top]).sum()
  first = sample(model, params, prompt, 1, jax.random.key(0), top_k=3)[:, 0]
  assert set(first) <= set(top)
  _assert_drawn_from(first, probs)


def test_top_k_keeps_exactly_k_tokens_when_the_kth_is_tied():
  logits = jnp.array([[1.0, 1.0, 1.0, 0.0, -1.0], [0.0, 2.0, 2.0, 2.0, 3.0]])
  kept = np.asarray(top_k_logits(logits, 2))
  np.testing.assert_array_equal(np.isfinite(kept).sum(-1), [2, 2])
  np.testing.assert_array_equal(kept[np.isfinite(kept)], [1.0, 1.0, 2.0, 3.0])
  np.testing.assert_array_equal(np.flatnonzero(np.isfinite(kept[1])), [1, 4])  # the lower id


def test_prompts_from_text():
  vocab = Vocab(('<unk>', '<eos>', 'the', 'cat'))
  np.testing.assert_array_equal(encode_prompt(vocab, 'the dog cat'), [1, 2, 0, 3])
  np.testing.assert_array_equal(encode_prompt(vocab, ''), [1])  # from scratch
  with pytest.raises(ValueError, match="'dog' is not in the vocabulary"):
    encode_prompt(Vocab(('<eos>', 'the')), 'the dog')
  chars = Vocab(('<eos>', '_', 'a', 'b'), kind='char')
  np.testing.assert_array_equal(encode_prompt(chars, 'ab a'), [0, 2, 3, 1, 2])


def test_generate_text_continues_the_prompt():
  vocab = Vocab(('<unk>', '<eos>', 'a', 'b', 'c', 'd', 'e'))
  model = RecurrentLM(Embedding(7, 4), Stack([LSTMCell(5)]), Softmax(7))
  params = init_params(model, jax.random.key(0))
  texts = generate_text(model, params, vocab, 'a b', num_tokens=4, num_samples=2, seed=1)
  assert len(texts) == 2 and all(t.startswith('a b') for t in texts)
  assert texts == generate_text(model, params, vocab, 'a b', 4, 2, seed=1)
  beam = generate_text(model, params, vocab, 'a b', 4, beam_width=3)
  assert len(beam) == 1 and beam[0].startswith('a b') and '\n' not in beam[0]
