"""`model.dtype`: bfloat16 products summed in float32 in every model, and
training that follows float32's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import loss_and_grads
from jaxprs import dot_equations

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import build_model, init_params


def _descend(model, params, tokens, steps=60, learning_rate=1.0):
  """Gradient descent on one batch; returns the loss of every step."""

  @jax.jit
  def step(p):
    loss, grads = loss_and_grads(model, p, tokens)
    return jax.tree.map(lambda w, g: w - learning_rate * g, p, grads), loss, grads

  losses = []
  for _ in range(steps):
    params, loss, grads = step(params)
    losses.append(float(loss))
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
  return losses


# Every model whose products `model.dtype` sets.
MODEL_FIELDS = {
  'lstm': {},
  'mogrifier': {'mogrifier': {'rounds': 2, 'rank': 2}},
  'mlstm': {'cell': 'mlstm'},
  'alstm': {'cell': 'alstm', 'alstm': {'latent': 'lstm', 'latent_size': 4}},
  'alstm_static': {'cell': 'alstm', 'alstm': {'latent': 'static', 'latent_size': 4}},
  'alstm_rhn': {'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn', 'latent_size': 4}},
  'dual': {'tie_embeddings': True, 'hidden_size': 6, 'dual': {'size': 5}},
  'mos': {'head': 'mos', 'mos': {'components': 2}},
  'mos_tied': {'tie_embeddings': True, 'head': 'mos', 'mos': {'components': 2}},
}


def _models(fields):
  """The tiny model of `fields` in bfloat16 and in float32."""
  config = base_config()
  config.model.update(embed_size=8, hidden_size=8)
  config.model.update(fields)
  models = []
  for dtype in ('bfloat16', 'float32'):
    config.model.dtype = dtype
    models.append(build_model(config.model, 31))
  return models


_TOKENS = np.random.default_rng(0).integers(0, 31, (4, 9)).astype(np.int32)


@pytest.mark.parametrize('fields', MODEL_FIELDS.values(), ids=MODEL_FIELDS.keys())
def test_bfloat16_multiplies_in_bfloat16_and_sums_in_float32(fields):
  model, _ = _models(fields)
  params = init_params(model, jax.random.key(0))
  # The dtypes are fixed when traced: op by op, every operation would compile on its own.
  logits, carries = jax.eval_shape(
    model.apply, {'params': params}, _TOKENS, model.initialize_carry(4)
  )
  assert logits.dtype == jnp.float32
  assert all(c.dtype == jnp.float32 for c in jax.tree.leaves(carries))
  # Every matrix product of every layer, forward and backward, takes bfloat16
  # operands and sums in float32 (`products`).
  loss = lambda p: model.apply({'params': p}, _TOKENS, model.initialize_carry(4))[0].sum()
  dots = dot_equations(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  assert len(dots) >= 9  # (embedding projection, recurrence, softmax) x 3, at least
  for eqn in dots:
    assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16, jnp.bfloat16], eqn
    assert eqn.outvars[0].aval.dtype == jnp.float32, eqn


# One model of each kind of layer that `products` computes (two compilations
# each, so not all of MODEL_FIELDS).
@pytest.mark.parametrize('name', ['lstm', 'mogrifier', 'alstm', 'mos_tied'])
def test_bfloat16_trains_like_float32(name):
  model, reference = _models(MODEL_FIELDS[name])
  params = init_params(model, jax.random.key(0))
  losses = _descend(model, params, _TOKENS)
  float32_losses = _descend(reference, params, _TOKENS)
  assert losses[-1] < 0.9 * losses[0]  # from ln 31 (the aLSTM learns slowest)
  # Descent at this rate on one batch is chaotic after some 30 steps (a
  # float32 rounding sends it elsewhere), so the two runs are compared on
  # the first 20: within 1e-3, where bfloat16 rounding alone moves them 1e-5.
  np.testing.assert_allclose(losses[:20], float32_losses[:20], rtol=1e-3)


def test_unknown_dtype_is_named():
  config = base_config()
  config.model.dtype = 'float8'
  with pytest.raises(ConfigError, match="model.dtype='float8' is not known"):
    build_model(config.model, 31)
