"""The train step's objective and update against main.lua's (Zaremba et al.),
written again: the NLL of each time step averaged over the batch, summed over
the window, its gradient clipped to global norm `clip` and taken with lr."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturb

from lm_zoo.cells import LSTMCell
from lm_zoo.configs import base_config
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack
from lm_zoo.training import create_train_state, make_optimizer, make_train_step

B, T, V, H = 3, 7, 13, 5


def _main_lua_update(model, params, carries, inputs, targets, lr, clip):
  """main.lua's fp/bp: err = sum_t ClassNLLCriterion (a mean over the batch)
  of log-softmax outputs; paramdx scaled by clip / norm when its norm exceeds
  clip; paramx -= lr * paramdx."""

  def err(p):
    logits, _ = model.apply({'params': p}, inputs, carries)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - jnp.log(jnp.exp(shifted).sum(-1, keepdims=True))
    picked = jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]  # (B, T)
    return sum(-picked[:, t].mean() for t in range(T))

  grads = jax.jit(jax.grad(err))(params)
  norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree.leaves(grads)))
  shrink = clip / norm if norm > clip else 1.0
  return jax.tree.map(lambda p, g: np.asarray(p) - lr * shrink * np.asarray(g), params, grads), norm


def test_sum_over_time_step_is_main_luas_clipped_sgd_update():
  model = RecurrentLM(Embedding(V, H), Stack([LSTMCell(H)] * 2), Softmax(V))  # no dropout
  tokens = np.random.default_rng(0).integers(0, V, (B, T + 1)).astype(np.int32)
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  config = base_config()
  config.optimizer.update(
    name='sgd', learning_rate=0.7, clip_norm=0.5, loss_reduction='sum_over_time'
  )
  optimizer = make_optimizer(config.optimizer)
  state = create_train_state(model, optimizer, config)
  params = perturb(state.params)
  carries = jax.tree.map(lambda x: x + 0.3, model.initialize_carry(B))  # a carried state
  expected, norm = _main_lua_update(model, params, carries, inputs, targets, 0.7, 0.5)
  # The clip acts; the gradient's norm before it checks the objective's
  # scale, which the clipped direction alone would hide.
  assert norm > 0.5
  step = make_train_step(model, optimizer, sum_over_time=True)
  new_state, metrics = step(
    state.replace(params=params, carries=carries), inputs, targets, jnp.ones((B, T))
  )
  np.testing.assert_allclose(float(metrics['grad_norm']), norm, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('dropout', [0.0, 0.3])
def test_a_window_padded_with_unscored_steps_takes_the_update_of_the_window_alone(dropout):
  """A window comes padded to a shared length (weight 0 past its end): the
  NLL summed over time, AR and TAR count its own steps only, so the update
  is the unpadded window's, and so is the state carried on (held past its
  own steps). Variational dropout draws one mask a window, whatever its
  length: the same masks."""
  stack = Stack(
    [LSTMCell(H)] * 2, dropout_hidden=dropout, dropout_state=dropout, dropout_output=dropout
  )
  model = RecurrentLM(Embedding(V, H, dropout=dropout), stack, Softmax(V))
  tokens = np.random.default_rng(1).integers(0, V, (B, T + 1)).astype(np.int32)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  weights = np.ones((B, T), np.float32)
  weights[-1, -2:] = 0  # the stream's own padding at the end of the last row
  config = base_config()
  config.optimizer.update(name='sgd', learning_rate=0.7, loss_reduction='sum_over_time')
  optimizer = make_optimizer(config.optimizer)
  fresh = lambda: create_train_state(model, optimizer, config).replace(
    carries=model.initialize_carry(B)
  )
  step = make_train_step(model, optimizer, sum_over_time=True, ar=2.0, tar=1.0, hold_padding=True)
  alone, alone_metrics = step(fresh(), inputs, targets, weights)
  pad = ((0, 0), (0, 4))
  padded, padded_metrics = step(
    fresh(), np.pad(inputs, pad), np.pad(targets, pad), np.pad(weights, pad)
  )
  np.testing.assert_allclose(padded_metrics['loss'], alone_metrics['loss'], rtol=1e-6)
  np.testing.assert_allclose(padded_metrics['grad_norm'], alone_metrics['grad_norm'], rtol=1e-5)
  for got, want in zip(jax.tree.leaves(padded.params), jax.tree.leaves(alone.params)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  for got, want in zip(jax.tree.leaves(padded.carries), jax.tree.leaves(alone.carries)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
