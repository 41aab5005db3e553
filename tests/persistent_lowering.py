"""What the persistent kernels' tests share: what test_persistent_lstm.py and
test_persistent_lstm_backward.py check of a kernel lowered for CUDA in each
of `lm_zoo.kernels.grid_barrier.MODES`, and the windows' tests
(test_persistent_scan.py, test_persistent_mogrifier_window.py) their
perturbed parameters, comparison and a recipe's stack lowered for CUDA."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.models import Stack

FENCE = 'fence.proxy.async.global'


def check_lowered_modes(lowered):
  """`lowered(mode)`: the module's text. The persistent form has the global
  semaphore (an int32 scratch passed in as zeros; a release add and a polling load, at the
  GPU's scope, not the system's) and the proxy fences; the unfenced form the
  semaphore without the fences; the barrier-free form neither; the per-step
  form is a loop of launches."""
  modes = ('persistent', 'unfenced', 'no_barrier', 'per_step')
  persistent, unfenced, free, per_step = (lowered(mode) for mode in modes)
  assert 'stablehlo.while' in per_step and 'stablehlo.while' not in persistent
  for text in (persistent, free, per_step):
    assert '@mosaic_gpu' in text and 'tensor<64x' in text
  assert 'tensor<1xi32>' in persistent and 'red.release.gpu.global' in persistent
  # The barrier counts from zero at every launch: Pallas passes the semaphore
  # as an aliased operand of zeros (its registration says so "at the moment").
  zeros = re.findall(r'(%\w+) = stablehlo\.constant dense<0> : tensor<i32>', persistent)
  assert any(
    f'stablehlo.broadcast_in_dim {zero}, dims = [] : (tensor<i32>) -> tensor<1xi32>' in persistent
    for zero in zeros
  )
  assert 'output_operand_aliases' in persistent
  assert 'ld.relaxed.gpu.global' in persistent and 'fence.acquire.gpu' in persistent
  assert '.sys' not in persistent
  assert 'tensor<1xi32>' not in free and 'red.release' not in free
  assert FENCE in persistent and 'red.release' in unfenced and FENCE not in unfenced


def perturbed(tree, seed):
  """Every leaf of `tree` plus 0.3 N(0, 1) noise of key `seed`."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(
    treedef, [x + 0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  )


def assert_close(got, want, tol=2e-5):
  """Every leaf of `got` within `tol` (relative and absolute) of `want`'s."""
  for got_part, want_part in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(got_part, want_part, rtol=tol, atol=tol)


def lowered_stack_gradient(cells, input_size: int) -> str:
  """The text of `jax.grad` of a recipe's stack of `cells` in training
  (batch 64, 70 steps, dropout between layers 0.3 and on the fed-back state
  0.37) under scan='persistent', lowered for CUDA with shape-only
  parameters. Call it with `jax.default_backend` pretending 'gpu'."""
  stack = Stack(cells, dropout_hidden=0.3, dropout_state=0.37, scan='persistent')
  carries, inputs = stack.initialize_carry(64, input_size), jnp.zeros((70, 64, input_size))
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  variables = jax.eval_shape(lambda: stack.init(rngs, carries, inputs, train=True))

  def loss(variables, carries, inputs):
    _, ys = stack.apply(variables, carries, inputs, train=True, rngs={'dropout': rngs['dropout']})
    return jnp.sum(ys)

  layouts = [jax.export.DisabledSafetyCheck.custom_call('LayoutConstraint')]
  exported = jax.export.export(jax.jit(jax.grad(loss)), platforms=['cuda'], disabled_checks=layouts)
  return exported(variables, carries, inputs).mlir_module()
