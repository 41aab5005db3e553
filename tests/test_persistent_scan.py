"""scan='persistent': an LSTM layer's window through the persistent Mosaic GPU
kernels (lm_zoo.cells.persistent_lstm), here interpreted a launch a step,
against the same layers under scan='fused' with the same bfloat16 products,
state dropout in training included; its refusals; 'auto' never takes it;
the recipe's layers as a GPU traces them, lowered for CUDA."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from persistent_lowering import assert_close, lowered_stack_gradient, perturbed

from lm_zoo.cells import LSTMCell, Mogrify, resolve_scan
from lm_zoo.cells.persistent_lstm import where_it_runs
from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import RecurrentLayer, Stack, build_model

T, B, M, N = 4, 3, 5, 8  # N padded to 32 units: 4 blocks of 8
BF16 = jnp.bfloat16


def _stack_loss_and_gradients(scan, variables, carries, inputs, weights):
  stack = Stack(
    [LSTMCell(N, dtype=BF16, cap_input_gate=True)] * 2,
    dropout_hidden=0.3,
    dropout_state=0.37,
    scan=scan,
  )

  def loss(variables, carries, inputs):
    new, ys = stack.apply(
      variables, carries, inputs, train=True, rngs={'dropout': jax.random.key(7)}
    )
    return jnp.sum(ys * weights) + sum(jnp.sum(c * 0.5) for c in jax.tree.leaves(new)), ys

  return jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(variables, carries, inputs)


def test_a_stack_with_state_dropout_trains_as_the_fused_window():
  """Two capped layers, bfloat16 products, the fed-back state and the
  layers' inputs dropped: loss, outputs and every gradient (the parameters',
  carries' and inputs') agree to float32 rounding; the state dropout
  changes them."""
  stack = Stack([LSTMCell(N, dtype=BF16, cap_input_gate=True)] * 2, scan='fused')
  inputs = jax.random.normal(jax.random.key(1), (T, B, M))
  carries = perturbed(stack.initialize_carry(B, M), 3)
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(7)}
  variables = perturbed(stack.init(rngs, carries, inputs, train=True), 4)
  weights = jax.random.normal(jax.random.key(5), (T, B, N))
  args = variables, carries, inputs, weights
  got = _stack_loss_and_gradients('persistent', *args)
  assert_close(got, _stack_loss_and_gradients('fused', *args))
  undropped = Stack([LSTMCell(N, dtype=BF16, cap_input_gate=True)] * 2, dropout_hidden=0.3)
  value = undropped.apply(variables, carries, inputs, train=True, rngs={'dropout': rngs['dropout']})
  with pytest.raises(AssertionError):
    assert_close(got[0][1], value[1], 1e-2)


def test_a_zero_round_mogrify_runs_its_lstms_persistent_window():
  cell = Mogrify(LSTMCell(N, dtype=BF16), rounds=0)
  assert resolve_scan(cell, 'persistent', state_mask=True) == 'persistent'
  inputs = jax.random.normal(jax.random.key(1), (T, B, M))
  carry = perturbed(cell.initialize_carry(jax.random.key(2), (B, M)), 3)
  variables = perturbed(
    RecurrentLayer(cell, scan='fused').init(jax.random.key(0), carry, inputs), 4
  )
  mask = (jax.random.uniform(jax.random.key(6), (B, N)) > 0.4) / 0.6

  def run(scan):
    loss = lambda v: jnp.sum(
      jnp.sin(RecurrentLayer(cell, scan=scan).apply(v, carry, inputs, mask)[1])
    )
    return jax.value_and_grad(loss)(variables)

  assert_close(run('persistent'), run('fused'))


@pytest.mark.parametrize(
  'cell, message',
  [
    (
      LSTMCell(N),
      r"bfloat16 only, not the inputs' dtype \(model.dtype=float32\): set model.dtype=bfloat16",
    ),
    (LSTMCell(N, dtype=jnp.float32), 'bfloat16 only, not float32: set model.dtype=bfloat16'),
    (
      Mogrify(LSTMCell(N, dtype=BF16), rounds=2, rank=3),
      "rounds in bfloat16 only, not the inputs' dtype: set model.dtype=bfloat16",
    ),
    (
      Mogrify(LSTMCell(N, dtype=BF16), rounds=2, dtype=jnp.float32, rank=3),
      'rounds in bfloat16 only, not float32',
    ),
    (
      Mogrify(LSTMCell(N, dtype=BF16), rounds=2, dtype=BF16),
      'low-rank rounds only .* got rank 0: set model.mogrifier.rank > 0',
    ),
    (Mogrify(LSTMCell(N), rounds=2, dtype=BF16, rank=3), 'bfloat16 only, not the inputs'),
    (
      Mogrify(Mogrify(LSTMCell(N, dtype=BF16), rounds=1), rounds=2, dtype=BF16, rank=3),
      'choose one of',
    ),
  ],
)
def test_a_layer_the_kernels_cannot_run_is_refused_with_the_reason(cell, message):
  with pytest.raises(ValueError, match=f"scan='persistent' cannot run .*{message}"):
    resolve_scan(cell, 'persistent')


def test_a_model_of_float32_products_is_refused_at_build_naming_the_fix():
  cfg = base_config().model
  cfg.update(embed_size=4, hidden_size=8, scan='persistent', dropout_state=0.3)
  with pytest.raises(ConfigError, match="bfloat16 only, not the inputs' dtype"):
    build_model(cfg, 10)
  cfg.dtype = 'bfloat16'
  assert build_model(cfg, 10).stack.scan == 'persistent'


def test_vmapped_over_seeds_each_seed_trains_as_its_own_fused_window():
  """`--seeds=N` and MC dropout vmap the window: the kernels then run one
  model a launch, and each seed's loss and gradients (the state mask's
  included) are its own run's under 'fused'."""
  cell = LSTMCell(N, dtype=BF16, cap_input_gate=True)
  inputs = jax.random.normal(jax.random.key(1), (T, B, M))
  carry = perturbed(cell.initialize_carry(jax.random.key(2), (B, M)), 3)
  variables = RecurrentLayer(cell).init(jax.random.key(0), carry, inputs)
  seeds = [perturbed(variables, seed) for seed in (4, 5)]
  masks = [(jax.random.uniform(jax.random.key(seed), (B, N)) > 0.4) / 0.6 for seed in (6, 7)]

  def run(scan, variables, mask):
    loss = lambda v, m: jnp.sum(
      jnp.sin(RecurrentLayer(cell, scan=scan).apply(v, carry, inputs, m)[1])
    )
    return jax.value_and_grad(loss, (0, 1))(variables, mask)

  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *zip(seeds, masks))
  got = jax.vmap(functools.partial(run, 'persistent'))(*stacked)
  for k, (seed, mask) in enumerate(zip(seeds, masks)):
    assert_close(jax.tree.map(lambda leaf: leaf[k], got), run('fused', seed, mask))


def _mosaic_launches(text):
  """The operand and result types of every Mosaic GPU launch in `text`."""
  calls = [line for line in text.splitlines() if '@mosaic_gpu' in line]
  return [call.split(' : ')[-1].split(' loc(')[0] for call in calls]


def test_on_a_gpu_vmapped_windows_launch_one_models_grid_in_a_loop(monkeypatch):
  """Pallas would batch a launch by widening its grid, the seeds' blocks
  sharing one barrier: vmapped, each launch is one model's, in a loop."""
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  layer = RecurrentLayer(LSTMCell(N, dtype=BF16), scan='persistent')
  carry, inputs = (jnp.zeros((B, N)),) * 2, jnp.zeros((T, B, M))
  variables = jax.eval_shape(
    lambda: RecurrentLayer(LSTMCell(N, dtype=BF16)).init(jax.random.key(0), carry, inputs)
  )
  seeds = jax.tree.map(lambda x: jax.ShapeDtypeStruct((3, *x.shape), x.dtype), variables)
  gradient = jax.grad(lambda v: jnp.sum(layer.apply(v, carry, inputs)[1]))

  def lowered(function, args):
    return jax.export.export(jax.jit(function), platforms=['cuda'])(args).mlir_module()

  one, three = lowered(gradient, variables), lowered(jax.vmap(gradient), seeds)
  assert len(_mosaic_launches(one)) == 2 and 'stablehlo.while' not in one
  assert _mosaic_launches(three) == _mosaic_launches(one) and 'stablehlo.while' in three


@pytest.mark.parametrize(
  'batch, steps, message',
  [
    (65, None, r'at most 64 rows a window \(one warpgroup\), got batch 65: set data.batch_size'),
    (B, jnp.arange(T) < 2, 'cannot hold the state past .* leave data.pad_windows_to unset'),
  ],
)
def test_what_only_the_window_tells_is_refused_when_it_runs(batch, steps, message):
  layer = RecurrentLayer(LSTMCell(N, dtype=BF16), scan='persistent')
  carry = (jnp.zeros((batch, N)),) * 2
  inputs = jnp.ones((T, batch, M))
  variables = RecurrentLayer(LSTMCell(N, dtype=BF16), scan='fused').init(
    jax.random.key(0), carry, inputs
  )
  with pytest.raises(ValueError, match=message):
    layer.apply(variables, carry, inputs, None, steps)


@pytest.mark.parametrize('backend', ['cpu', 'gpu'])
def test_auto_never_takes_the_persistent_window(monkeypatch, backend):
  """It has not been timed on a GPU yet: taken by name only."""
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  assert resolve_scan(LSTMCell(N, dtype=BF16), 'auto', state_mask=True) == 'fused'
  assert resolve_scan(Mogrify(LSTMCell(N, dtype=BF16), rounds=0), 'auto') == 'fused'


def test_it_runs_compiled_on_a_gpu_and_interpreted_a_step_a_launch_elsewhere(monkeypatch):
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  run = where_it_runs()
  assert run['mode'] == 'per_step' and isinstance(run['interpret'], plgpu.InterpretGPUParams)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  assert where_it_runs() == dict(mode='persistent', interpret=None)


def test_on_a_gpu_a_masked_stacks_gradient_lowers_as_four_persistent_kernels(monkeypatch):
  """The 24M LSTM recipe's layers (2 x 951, batch 64, 70 steps, capped,
  state dropout) as a GPU traces them: each layer's window forward and back
  one Mosaic GPU kernel with its semaphore, lowered for CUDA here."""
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  cells = [LSTMCell(951, dtype=BF16, cap_input_gate=True)] * 2
  text = lowered_stack_gradient(cells, 400)
  assert text.count('@mosaic_gpu') == 4 and text.count('red.release') == 4
