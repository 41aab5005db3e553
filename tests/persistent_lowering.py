"""What the persistent kernels' tests share: what test_persistent_lstm.py and
test_persistent_lstm_backward.py check of a kernel lowered for CUDA in each
of `lm_zoo.kernels.grid_barrier.MODES`, and the windows' tests
(test_persistent_scan.py, test_persistent_mogrifier_window.py) their
perturbed parameters and comparison."""

import jax
import numpy as np

FENCE = 'fence.proxy.async.global'


def check_lowered_modes(lowered):
  """`lowered(mode)`: the module's text. The persistent form has the global
  semaphore (an int32 scratch; a release add and a polling load) and the
  proxy fences; the unfenced form the semaphore without the fences; the
  barrier-free form neither; the per-step form is a loop of launches."""
  modes = ('persistent', 'unfenced', 'no_barrier', 'per_step')
  persistent, unfenced, free, per_step = (lowered(mode) for mode in modes)
  assert 'stablehlo.while' in per_step and 'stablehlo.while' not in persistent
  for text in (persistent, free, per_step):
    assert '@mosaic_gpu' in text and 'tensor<64x' in text
  assert 'tensor<1xi32>' in persistent and 'red.release' in persistent
  assert 'ld.relaxed' in persistent
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
