"""The LSTM-RHN stack's fused window (`lstm_rhn_recurrence`) against the
stack's step-by-step 'scan' path: outputs, final carry and every gradient,
with and without its dropout masks, float32 and bfloat16; one weight's
gradient against finite differences; and what it refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxprs import summed_sizes_in_loops

from lm_zoo.cells import ALSTMCell, LSTMCell, LSTMRHNStack, StaticLatent, resolve_scan
from lm_zoo.cells.lstm_rhn_recurrence import LayerMasks, lstm_rhn_recurrence
from lm_zoo.cells.lstm_rhn_window import lstm_rhn_window
from lm_zoo.configs import base_config
from lm_zoo.layers.products import aligned_contractions
from lm_zoo.models import RecurrentLayer, build_model, init_params

M, K, B, T = 3, 2, 2, 5
SIZES = (4, 3)  # two layers of different widths


def _stack(dtype=None, dropout=0.0, **cell_fields):
  cells = [
    ALSTMCell(
      n,
      latent_size=K,
      cap_input_gate=layer == 1,
      dtype=dtype,
      dropout_latent=dropout,
      parent=None,
      **cell_fields,
    )
    for layer, n in enumerate(SIZES)
  ]
  return LSTMRHNStack(
    cells, dropout_hidden=dropout, dropout_state=dropout, deterministic=dropout == 0
  )


def _window(stack, seed=1):
  """Random inputs and a random carry (the latents' too)."""
  rng = np.random.default_rng(seed)
  carry = jax.tree.map(
    lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
    stack.initialize_carry(jax.random.key(0), (B, M)),
  )
  return carry, jnp.asarray(rng.normal(size=(T, B, M)), jnp.float32)


def _loss(out):
  carry, hs = out
  return jnp.sum(jnp.sin(hs)) + sum(
    jnp.sum(jnp.cos(leaf) * (k + 1)) for k, leaf in enumerate(jax.tree.leaves(carry))
  )


def _random_like(shapes, seed=1, scale=0.5):
  """N(0, scale²) arrays of the shapes of `shapes` (from `jax.eval_shape` of an
  init: the cells' orthogonal initialisers take longer to compile than the tests)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: jnp.asarray(scale * rng.normal(size=a.shape), a.dtype), shapes)


def _params(stack, carry, xs):
  return _random_like(
    jax.eval_shape(RecurrentLayer(stack, scan='scan').init, jax.random.key(0), carry, xs)['params'][
      'cell'
    ]
  )


def _both(stack, unroll=1, rngs=None):
  """The scan path and the fused window as functions of (params, carry, xs)."""
  carry, xs = _window(stack)
  params = _params(stack, carry, xs)
  run = lambda scan: (
    lambda p, c, x: RecurrentLayer(stack, unroll=unroll, scan=scan).apply(
      {'params': {'cell': p}}, c, x, rngs=rngs
    )
  )
  return run('scan'), run('fused'), (params, carry, xs)


def _outputs_and_grads(run, args):
  """run(*args) and the gradient of `_loss` of it for every argument, in one compilation."""
  with_outputs = lambda *a: (_loss(run(*a)), run(*a))
  (_, outputs), grads = jax.jit(jax.value_and_grad(with_outputs, argnums=(0, 1, 2), has_aux=True))(
    *args
  )
  return outputs, grads


def _assert_close(got, want, rtol, atol):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


@pytest.mark.parametrize('dropout, unroll', [(0.0, 2), (0.4, 1)], ids=['undropped', 'dropped'])
def test_fused_window_equals_the_scan_in_values_and_every_gradient(dropout, unroll):
  rngs = {'dropout': jax.random.key(3)} if dropout else None
  scanned, fused, args = _both(_stack(dropout=dropout), unroll, rngs)
  _assert_close(_outputs_and_grads(fused, args), _outputs_and_grads(scanned, args), 1e-5, 1e-6)


def test_aligned_weights_give_the_scan_in_values_and_every_gradient():
  """Two layers of 63 units and latents, 63 inputs, every weight padded
  before the loops to a multiple of 64 rows: every product in the forward
  and backward loops sums over a multiple of 64 (v = [x; h; z]: 189 -> 192,
  gates 252 -> 256, the policy's 882 -> 896), and values and gradients are
  the scan's."""
  cells = [
    ALSTMCell(63, latent_size=63, cap_input_gate=layer == 1, parent=None) for layer in range(2)
  ]
  stack = LSTMRHNStack(cells, deterministic=True)
  rng = np.random.default_rng(2)
  carry = jax.tree.map(
    lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
    stack.initialize_carry(jax.random.key(0), (B, 63)),
  )
  xs = jnp.asarray(rng.normal(size=(3, B, 63)), jnp.float32)
  args = (_params(stack, carry, xs), carry, xs)
  run = lambda scan: (
    lambda p, c, x: RecurrentLayer(stack, scan=scan).apply({'params': {'cell': p}}, c, x)
  )
  with aligned_contractions(64):
    gradient = jax.grad(lambda *a: _loss(run('fused')(*a)), argnums=(0, 1, 2))
    sizes = summed_sizes_in_loops(jax.make_jaxpr(gradient)(*args).jaxpr)
    got = _outputs_and_grads(run('fused'), args)
  assert sorted(set(sizes)) == [64, 192, 256, 896]
  # float32 sums of 63 to 882 terms, 3 steps of 2 layers and back: either path
  # is within 5e-5 of each array's largest entry of a float64 run (4.6e-5 at
  # most, jax 0.10 and 0.11), so within 1e-4 of the other (3.5e-5 seen).
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(
      g, w, rtol=1e-5, atol=1e-4 * float(jnp.max(jnp.abs(w)))
    ),
    got,
    _outputs_and_grads(run('scan'), args),
  )


def test_the_language_model_trains_the_same_under_either_path():
  """The LSTM-RHN model with all three dropouts, one 'dropout' RNG: the
  fused window draws the masks the scan draws, so loss and gradients agree;
  another RNG gives other masks."""

  def model(scan):
    cfg = base_config().model
    cfg.update(
      cell='alstm', embed_size=5, hidden_size=6, dropout_hidden=0.3, dropout_state=0.3, scan=scan
    )
    cfg.alstm.update(latent='lstm_rhn', latent_size=K, dropout_latent=0.3)
    return build_model(cfg, 20)

  tokens = jnp.asarray(np.random.default_rng(7).integers(0, 20, (B, T)))
  lm = model('scan')
  params = _random_like(jax.eval_shape(lambda key: init_params(lm, key), jax.random.key(0)))

  def train_step(scan):
    lm = model(scan)

    def loss(p, key):
      logits, _ = lm.apply(
        {'params': p}, tokens, lm.initialize_carry(B), train=True, rngs={'dropout': key}
      )
      return -jnp.mean(jax.nn.log_softmax(logits)[..., 1])

    return jax.jit(jax.value_and_grad(loss))

  fused = train_step('fused')
  _assert_close(
    fused(params, jax.random.key(3)), train_step('scan')(params, jax.random.key(3)), 1e-5, 1e-6
  )
  assert resolve_scan(_stack(dropout=0.3), 'auto') == 'fused'  # so training runs it
  other = jax.tree.leaves(fused(params, jax.random.key(4))[1])
  assert any(
    not np.allclose(a, b, rtol=1e-2, atol=1e-4)
    for a, b in zip(other, jax.tree.leaves(fused(params, jax.random.key(3))[1]))
  )


def test_bfloat16_products_agree_with_the_scan_within_their_rounding():
  scanned, fused, args = _both(_stack(dtype=jnp.bfloat16))
  (outputs, grads), (want_outputs, want_grads) = (
    _outputs_and_grads(run, args) for run in (fused, scanned)
  )
  _assert_close(outputs, want_outputs, 2e-2, 2e-2)
  # Every gradient within bfloat16's rounding of the largest entry of its array.
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, atol=3e-2 * float(jnp.max(jnp.abs(w))) + 1e-3),
    grads,
    want_grads,
  )


def test_a_context_weight_gradient_matches_finite_differences():
  """The bottom latent's weights on z^(L)_{t-1}: the gradient that reaches
  them crosses both layers and the steps, through explicit masks."""
  stack = _stack()
  carry, xs = _window(stack)
  params = _params(stack, carry, xs)
  rng = np.random.default_rng(2)
  mask = lambda n: rng.binomial(1, 0.7, (B, n)) / 0.7
  masks = [
    LayerMasks(None, mask(SIZES[0]), mask(K)),
    LayerMasks(mask(SIZES[0]), mask(SIZES[1]), mask(K)),
  ]
  with jax.enable_x64():  # float64 throughout, so that the differences resolve the slope
    wide = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree)
    params, carry, xs, masks = wide(([params['cells_0'], params['cells_1']], carry, xs, masks))
    kernel = params[0]['latent']['input']['kernel']
    context = slice(M + SIZES[0], None)  # the rows that read the top layer's z

    def loss(value, entry):
      bottom = {
        **params[0],
        'latent': {
          **params[0]['latent'],
          'input': {**params[0]['latent']['input'], 'kernel': kernel.at[entry].set(value)},
        },
      }
      return _loss(
        lstm_rhn_recurrence(xs, [bottom, params[1]], carry, masks, cap_input_gates=(False, True))
      )

    loss = jax.jit(loss, static_argnums=1)
    grads = jax.grad(lambda k: loss(k, ...))(kernel)[context]
    row, column = np.unravel_index(int(jnp.argmax(jnp.abs(grads))), grads.shape)
    entry = (M + SIZES[0] + row, column)
    eps = 1e-5
    numeric = (loss(kernel[entry] + eps, entry) - loss(kernel[entry] - eps, entry)) / (2 * eps)
    np.testing.assert_allclose(grads[row, column], numeric, rtol=1e-6)


def test_auto_runs_the_window_and_other_adaptation_models_are_refused():
  assert resolve_scan(_stack(), 'auto') == 'fused'
  static = LSTMRHNStack([ALSTMCell(n, latent=StaticLatent, parent=None) for n in SIZES])
  capped = _stack(latent=lambda **kw: LSTMCell(cap_input_gate=True, **kw))
  for stack in (static, capped):
    with pytest.raises(
      ValueError,
      match="scan='fused' cannot run LSTMRHNStack: the fused "
      'LSTM-RHN window runs LSTMCell adaptation models only',
    ):
      resolve_scan(stack, 'fused')
    assert resolve_scan(stack, 'auto') == 'scan'

  class Other(ALSTMCell):
    pass

  other = LSTMRHNStack([Other(4, parent=None), ALSTMCell(3, parent=None)])
  with pytest.raises(ValueError, match='steps ALSTMCell layers only, and layer 0 is Other'):
    resolve_scan(other, 'fused')
  with pytest.raises(
    ValueError,
    match="'hoisted' cannot run LSTMRHNStack: choose one of 'auto', 'scan', 'fused', 'remat'",
  ):
    resolve_scan(_stack(), 'hoisted')


def test_a_mask_on_the_whole_carry_is_refused():
  stack = _stack()
  carry, xs = _window(stack)
  with pytest.raises(ValueError, match='masks its fed-back states itself'):
    lstm_rhn_window(stack, {}, carry, xs, jnp.ones((B, 3)))
  for scan in ('auto', 'scan', 'remat', 'fused'):  # each way, not only the window
    layer = RecurrentLayer(stack, scan=scan)
    with pytest.raises(ValueError, match='masks its fed-back states itself'):
      layer.init(jax.random.key(0), carry, xs, state_mask=jnp.ones((B, SIZES[-1])))
  with pytest.raises(ValueError, match='2 layers of parameters, but 1 carries'):
    lstm_rhn_recurrence(xs, [{}, {}], carry[:1])
