"""A window padded past its own steps (`steps`, lm_zoo.cells.held_steps),
under every way of running it, against the same window unpadded: the own
steps' outputs, the carry after them and every gradient are the unpadded
window's; the padded steps output zeros and have no gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.cells import ALSTMCell, LSTMCell, Mogrify, StaticLatent
from lm_zoo.cells.held_steps import check_steps, held, output_gradients, own
from lm_zoo.models import LSTMRHN, RecurrentLayer, Stack

T, OWN, B, M, N = 6, 4, 3, 5, 7
STEPS = jnp.arange(T) < OWN
# 'remat' is 'scan''s step recomputed; the capped gate changes no hold.
WAYS = {
  'lstm': (LSTMCell(N), ('scan', 'hoisted', 'fused', 'pallas', 'cudnn')),
  'mogrifier': (Mogrify(LSTMCell(N), rounds=3), ('scan', 'fused', 'pallas')),
  'alstm': (ALSTMCell(N, latent_size=4), ('scan', 'fused', 'pallas')),
  'alstm_static': (ALSTMCell(N, latent_size=4, latent=StaticLatent), ('scan', 'fused')),
}
CASES = [(name, scan) for name, (_, scans) in WAYS.items() for scan in scans]


def _perturbed(tree, seed):
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(
    treedef, [x + 0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  )


def _compare(apply, variables, carry, inputs, width):
  """apply(variables, carry, inputs, steps) on the padded and on the own
  steps: outputs, carry and gradients (of a loss on both) agree."""
  weights = jax.random.normal(jax.random.key(5), (T, B, width))

  def loss(variables, inputs, carry, padded):
    if padded:
      new, ys = apply(variables, carry, inputs, STEPS)
    else:
      new, ys = apply(variables, carry, inputs[:OWN], None)
    value = jnp.sum(ys[:OWN] * weights[:OWN]) + sum(
      jnp.sum(c * (0.5 + i)) for i, c in enumerate(jax.tree.leaves(new))
    )
    return value, (new, ys)

  # One program each way: run op by op, every piece of the layer compiles alone.
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)
  (_, (new_own, ys_own)), grads_own = grad(variables, inputs, carry, False)
  (_, (new_pad, ys_pad)), grads_pad = grad(variables, inputs, carry, True)
  assert ys_pad.shape[0] == T and not np.any(ys_pad[OWN:])
  assert not np.any(grads_pad[1][OWN:])  # the padded inputs get no gradient
  for got, want in zip(
    jax.tree.leaves((new_pad, ys_pad[:OWN], grads_pad)),
    jax.tree.leaves((new_own, ys_own, grads_own)),
  ):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('name, scan', CASES)
def test_a_layer_holds_its_state_past_its_own_steps(name, scan):
  cell = WAYS[name][0]
  layer = RecurrentLayer(cell, scan=scan)
  inputs = jax.random.normal(jax.random.key(1), (T, B, M))
  carry = _perturbed(cell.initialize_carry(jax.random.key(2), (B, M)), 3)
  variables = _perturbed(layer.init(jax.random.key(0), carry, inputs), 4)
  mask = None if scan == 'cudnn' else (jax.random.uniform(jax.random.key(6), (B, N)) > 0.3)
  apply = lambda v, c, x, steps: layer.apply(v, c, x, mask, steps)
  _compare(apply, variables, carry, inputs, N)


@pytest.mark.parametrize(
  'stack_type, scan', [(LSTMRHN, 'scan'), (LSTMRHN, 'fused'), (Stack, 'fused')]
)
def test_a_stack_with_dropout_holds_every_layers_state(stack_type, scan):
  """The aLSTM's LSTM-RHN stack (whose fused window draws its masks once a
  window) and a plain stack, both dropping out, under one dropout key."""
  cells = [ALSTMCell(N, latent_size=4, dropout_latent=0.2)] * 2
  if stack_type is Stack:
    cells = [LSTMCell(N)] * 2
  stack = stack_type(cells, dropout_hidden=0.3, dropout_state=0.3, scan=scan)
  inputs = jax.random.normal(jax.random.key(1), (T, B, M))
  carries = _perturbed(stack.initialize_carry(B, M), 3)
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(7)}
  variables = _perturbed(stack.init(rngs, carries, inputs, train=True), 4)
  apply = lambda v, c, x, steps: stack.apply(
    v, c, x, train=True, steps=steps, rngs={'dropout': jax.random.key(7)}
  )
  _compare(apply, variables, carries, inputs, N)


def test_held_and_own_select_by_step_and_steps_are_checked():
  new, old = {'c': jnp.ones(3)}, {'c': jnp.zeros(3)}
  assert held(None, new, old) is new and own(None, new) is new
  np.testing.assert_array_equal(held(jnp.array(False), new, old)['c'], old['c'])
  np.testing.assert_array_equal(own(jnp.array(False), new)['c'], jnp.zeros(3))
  d_outputs, d_final_h = jnp.ones((4, 1, 1)), jnp.full((1, 1), 10.0)
  np.testing.assert_array_equal(
    output_gradients(d_outputs, None, d_final_h)[:, 0, 0], [1, 1, 1, 11]
  )
  np.testing.assert_array_equal(
    output_gradients(d_outputs, jnp.array([True, True, False, False]), d_final_h)[:, 0, 0],
    [1, 11, 0, 0],
  )
  assert check_steps(np.array([1, 1, 0]), 3).dtype == jnp.bool_
  with pytest.raises(ValueError, match="mark each of the window's 4 steps, got shape"):
    check_steps(jnp.ones(3, bool), 4)
