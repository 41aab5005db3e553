"""The window kernels called with their cells' parameters explicitly, against
the plain scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturb

from lm_zoo.cells import LSTMCell, Mogrify
from lm_zoo.cells.window_kernels import lstm_window, mogrified_lstm_window
from lm_zoo.models import RecurrentLayer

M, N, B, T = 3, 5, 2, 6


def _window(seed=1):
  rng = np.random.default_rng(seed)
  xs = jnp.asarray(rng.normal(size=(T, B, M)), jnp.float32)
  carry = tuple(jnp.asarray(rng.normal(size=(B, N)), jnp.float32) for _ in range(2))
  mask = jnp.asarray(rng.binomial(1, 0.7, (B, N)) / 0.7, jnp.float32)
  return carry, xs, mask


@pytest.mark.parametrize(
  'cell, kernel',
  [
    (LSTMCell(N, cap_input_gate=True), lstm_window),
    (Mogrify(LSTMCell(N), rounds=3, rank=2), mogrified_lstm_window),
  ],
  ids=['lstm', 'mogrifier'],
)
def test_fused_kernels_take_their_parameters_and_match_the_plain_scan(cell, kernel):
  carry, xs, mask = _window()
  params = perturb(
    RecurrentLayer(cell, scan='scan').init(jax.random.key(0), carry, xs, mask)['params']
  )

  def loss(run, p):
    (c, h), out = run(p)
    return jnp.sum(jnp.sin(out)) + jnp.sum(c**2) + jnp.sum(h)

  direct = lambda p: kernel(cell, p['cell'], carry, xs, mask)  # no module around it
  scanned = lambda p: RecurrentLayer(cell, scan='scan').apply({'params': p}, carry, xs, mask)
  np.testing.assert_allclose(direct(params)[1], scanned(params)[1], rtol=1e-5, atol=1e-6)
  # Jitted: one compile each, where eager gradients compile every primitive of the scans.
  got, want = (
    jax.jit(jax.grad(lambda p, run=run: loss(run, p)))(params) for run in (direct, scanned)
  )
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5), got, want)
