"""Our cells with NNX's face: the same numbers as the linen cells, in
nnx.RNN and nnx.Bidirectional, parameters interchangeable."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturb
from flax import nnx

from lm_zoo.cells import ALSTMCell, LSTMCell, MLSTMCell, Mogrify
from lm_zoo.cells.alstm import StaticLatent
from lm_zoo.cells.nnx import NNXCell

B, T, M = 2, 6, 5
X = jnp.asarray(np.random.default_rng(0).normal(size=(B, T, M)), jnp.float32)


@pytest.mark.parametrize(
  'make',
  [
    lambda: LSTMCell(8, cap_input_gate=True),
    lambda: Mogrify(LSTMCell(8), rounds=3, rank=2),
    lambda: MLSTMCell(8),
    lambda: ALSTMCell(8, latent_size=3),
    lambda: ALSTMCell(8, latent=StaticLatent, latent_size=3),
  ],
  ids=['lstm', 'mogrifier', 'mlstm', 'alstm', 'alstm_static'],
)
def test_nnx_rnn_of_a_cell_is_the_linen_rnn_with_its_parameters(make):
  cell = NNXCell(make(), M, rngs=nnx.Rngs(0))
  params = perturb(cell.linen_params())  # nonzero biases too
  cell.load_linen_params(params)
  linen = nn.RNN(make())
  expected = linen.apply({'params': {'cell': params}}, X)
  np.testing.assert_allclose(nnx.RNN(cell)(X), expected, rtol=1e-5, atol=1e-6)
  # A step alone, and weights trained with the NNX face run in linen.
  carry = cell.initialize_carry((B, M))
  _, y = cell(carry, X[:, 0])
  _, y_linen = make().apply({'params': params}, carry, X[:, 0])
  np.testing.assert_allclose(y, y_linen, rtol=1e-6)


def test_bidirectional_runs_both_ways():
  forward = nnx.RNN(NNXCell(LSTMCell(4), M, rngs=nnx.Rngs(1)))
  backward = nnx.RNN(NNXCell(LSTMCell(4), M, rngs=nnx.Rngs(2)))
  out = nnx.Bidirectional(forward, backward)(X)
  assert out.shape == (B, T, 8)
  np.testing.assert_allclose(out[..., :4], forward(X), rtol=1e-6)
  np.testing.assert_allclose(out[..., 4:], backward(X[:, ::-1])[:, ::-1], rtol=1e-6)


def test_gradients_reach_the_nnx_parameters():
  model = nnx.RNN(NNXCell(Mogrify(LSTMCell(4), rounds=2), M, rngs=nnx.Rngs(0)))
  grads = nnx.grad(lambda m: jnp.sum(m(X) ** 2))(model)
  assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(nnx.state(grads)))


def test_parameters_of_another_cell_are_refused():
  cell = NNXCell(LSTMCell(4), M, rngs=nnx.Rngs(0))
  other = NNXCell(LSTMCell(6), M, rngs=nnx.Rngs(0)).linen_params()
  with pytest.raises(ValueError, match='do not fit this cell'):
    cell.load_linen_params(other)
