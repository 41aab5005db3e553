"""Evaluation scores every token once at any batch size, as a direct sum would."""

import math

import jax
import numpy as np
import optax

from lm_zoo.models import RecurrentLM, init_params
from lm_zoo.training import EvalResult, evaluate_stream, make_eval_step


def test_batch_sizes_agree_with_one_pass():
  model = RecurrentLM(vocab_size=13, embed_size=5, hidden_sizes=(6,))
  params = init_params(model, jax.random.key(0))
  stream = np.random.default_rng(0).integers(0, 13, 101).astype(np.int32)
  logits, _ = model.apply({'params': params}, stream[None, :-1], model.initialize_carry(1))
  direct = float(optax.softmax_cross_entropy_with_integer_labels(
      logits[0], stream[1:]).mean())
  step = make_eval_step(model)
  for bptt in (100, 7):
    result = evaluate_stream(step, params, model.initialize_carry(1), stream, 1, bptt)
    assert result.num_tokens == 100
    np.testing.assert_allclose(result.loss, direct, rtol=1e-5)
  # four rows of 25 pairs, each scored from a zero state as its own stream
  rows = [stream[25 * b:25 * b + 26] for b in range(4)]
  per_row = []
  for row in rows:
    logits, _ = model.apply({'params': params}, row[None, :-1], model.initialize_carry(1))
    per_row.append(optax.softmax_cross_entropy_with_integer_labels(logits[0], row[1:]))
  result = evaluate_stream(step, params, model.initialize_carry(4), stream, 4, 9)
  assert result.num_tokens == 100
  np.testing.assert_allclose(result.loss, float(np.mean(np.concatenate(per_row))),
                             rtol=1e-5)


def test_units():
  r = EvalResult(loss=math.log(2) * 1.5, num_tokens=10, unit='char')
  assert math.isclose(r.bits_per_token, 1.5)
  assert 'bits per character 1.5000' in r.summary()
  assert EvalResult(loss=math.log(100.0), num_tokens=1).summary() == 'perplexity 100.00'
