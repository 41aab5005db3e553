"""scan='persistent' for `Mogrify(LSTMCell)` of low-rank rounds
(lm_zoo.cells.persistent_mogrifier): the forward pass and the backward
chain one persistent kernel each, here interpreted a launch a phase, the
weight gradients the fused window's products;
against the same layer under scan='fused' with the same bfloat16 products,
values and every gradient; what the window refuses; the recipe's layers as
a GPU traces them, lowered for CUDA."""

import jax
import jax.numpy as jnp
import pytest
from persistent_lowering import assert_close, lowered_stack_gradient, perturbed

from lm_zoo.cells import LSTMCell, Mogrify, resolve_scan
from lm_zoo.models import RecurrentLayer

T, B, M, N = 3, 3, 5, 8
BF16 = jnp.bfloat16


def _mogrifier():
  return Mogrify(LSTMCell(N, dtype=BF16, cap_input_gate=True), 3, 4, dtype=BF16)


def test_a_masked_layer_trains_as_the_fused_window():
  """Loss, outputs and the gradients of every parameter, the carry, the
  inputs and the state mask agree to float32 rounding (the kernels' other
  settings: test_persistent_mogrifier.py, test_persistent_mogrifier_backward.py)."""
  cell = _mogrifier()
  inputs = jax.random.normal(jax.random.key(1), (T, B, M))
  carry = perturbed(cell.initialize_carry(jax.random.key(2), (B, M)), 3)
  variables = perturbed(
    RecurrentLayer(cell, scan='fused').init(jax.random.key(0), carry, inputs), 4
  )
  mask = (jax.random.uniform(jax.random.key(6), (B, N)) > 0.4) / 0.6

  def run(scan):
    def loss(variables, carry, inputs, mask):
      new, ys = RecurrentLayer(cell, scan=scan).apply(variables, carry, inputs, mask)
      return jnp.sum(jnp.sin(ys)) + sum(jnp.sum(c * 0.5) for c in jax.tree.leaves(new)), ys

    return jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)(variables, carry, inputs, mask)

  assert_close(run('persistent'), run('fused'))


@pytest.mark.parametrize(
  'batch, steps, message',
  [
    (65, None, r'at most 64 rows a window \(one warpgroup\), got batch 65: set data.batch_size'),
    (B, jnp.arange(T) < 2, 'cannot hold the state past .* leave data.pad_windows_to unset'),
  ],
)
def test_what_only_the_window_tells_is_refused_when_it_runs(batch, steps, message):
  carry = (jnp.zeros((batch, N)),) * 2
  inputs = jnp.ones((T, batch, M))
  variables = RecurrentLayer(_mogrifier(), scan='fused').init(jax.random.key(0), carry, inputs)
  with pytest.raises(ValueError, match=message):
    RecurrentLayer(_mogrifier(), scan='persistent').apply(variables, carry, inputs, None, steps)


@pytest.mark.parametrize('backend', ['cpu', 'gpu'])
def test_auto_never_takes_it(monkeypatch, backend):
  """It has not been timed on a GPU yet: taken by name only."""
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  assert resolve_scan(_mogrifier(), 'persistent', state_mask=True) == 'persistent'
  assert resolve_scan(_mogrifier(), 'auto', state_mask=True) == 'fused'


def test_on_a_gpu_the_recipes_gradient_lowers_as_four_persistent_kernels(monkeypatch):
  """The 24M Mogrifier recipe's layers (2 x 912, 5 rounds of rank 84, batch
  64, 70 steps, capped, state dropout) as a GPU traces them: each layer's
  forward pass and backward chain one Mosaic GPU kernel with its semaphore."""
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  cell = Mogrify(LSTMCell(912, dtype=BF16, cap_input_gate=True), 5, 84, dtype=BF16)
  text = lowered_stack_gradient([cell] * 2, 912)
  assert text.count('@mosaic_gpu') == 4 and 'red.release' in text


def test_a_state_mask_that_does_not_broadcast_to_h_is_refused():
  carry = (jnp.zeros((B, N)),) * 2
  inputs = jnp.ones((T, B, M))
  variables = RecurrentLayer(_mogrifier(), scan='fused').init(jax.random.key(0), carry, inputs)
  with pytest.raises(ValueError, match=r"state_mask: its shape \(3, 5\) .* carry's h \(3, 8\)"):
    RecurrentLayer(_mogrifier(), scan='persistent').apply(
      variables, carry, inputs, jnp.ones((B, 5))
    )
