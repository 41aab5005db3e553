"""The scan switch: what 'auto' picks for each cell, the refusals and the
registry."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_zoo.cells import (
  SCANS,
  ALSTMCell,
  CellScans,
  LSTMCell,
  MLSTMCell,
  Mogrify,
  Scan,
  register_scans,
  resolve_scan,
)
from lm_zoo.cells.scans import REGISTRY
from lm_zoo.models import RecurrentLayer, recurrent

M, N, B, T = 3, 5, 2, 6

AUTO = {
  'LSTMCell': (LSTMCell(N), 'fused'),
  'Mogrify(LSTMCell)': (Mogrify(LSTMCell(N), rounds=2), 'fused'),
  'Mogrify(LSTMCell) of no rounds': (Mogrify(LSTMCell(N), rounds=0), 'fused'),
  'Mogrify(GRUCell)': (Mogrify(nn.GRUCell(N), rounds=2), 'scan'),
  'Mogrify(GRUCell) of no rounds': (Mogrify(nn.GRUCell(N), rounds=0), 'scan'),
  'MLSTMCell': (MLSTMCell(N), 'scan'),
  'ALSTMCell': (ALSTMCell(N, latent_size=2), 'fused'),
  'ALSTMCell dropping its latent': (ALSTMCell(N, latent_size=2, dropout_latent=0.1), 'scan'),
  'GRUCell': (nn.GRUCell(N), 'scan'),
}


@pytest.mark.parametrize('cell, way', AUTO.values(), ids=AUTO.keys())
def test_auto_is_fused_where_a_kernel_exists_else_hoisted_else_scan(cell, way):
  assert resolve_scan(cell, 'auto') == way
  assert resolve_scan(cell, 'scan') == 'scan' and resolve_scan(cell, 'remat') == 'remat'


def test_the_scan_enum_is_the_strings_it_names():
  assert SCANS == tuple(str(way) for way in Scan) and Scan('fused') is Scan.FUSED
  assert resolve_scan(LSTMCell(N), Scan.HOISTED) == 'hoisted'
  carry, xs, _ = _window()
  params = RecurrentLayer(LSTMCell(N), scan='fused').init(jax.random.key(0), carry, xs)
  outputs = [
    RecurrentLayer(LSTMCell(N), scan=scan).apply(params, carry, xs)[1]
    for scan in ('fused', Scan.FUSED)
  ]
  np.testing.assert_array_equal(*outputs)


def test_a_way_a_cell_cannot_take_is_refused_naming_the_cell_and_the_ways_it_can():
  with pytest.raises(ValueError) as refused:
    resolve_scan(nn.GRUCell(N), 'fused')
  assert str(refused.value) == (
    "scan='fused' cannot run GRUCell: choose one of 'auto', 'scan', 'remat'"
  )
  with pytest.raises(
    ValueError,
    match=r"'hoisted' cannot run Mogrify\(LSTMCell\): choose one "
    r"of 'auto', 'scan', 'fused', 'pallas', 'remat'",
  ):
    resolve_scan(Mogrify(LSTMCell(N), rounds=2), 'hoisted')
  with pytest.raises(
    ValueError, match="scan='fast' is not known: choose one of " + ', '.join(SCANS)
  ):
    resolve_scan(LSTMCell(N), 'fast')
  carry = nn.GRUCell(N).initialize_carry(jax.random.key(0), (B, M))
  with pytest.raises(ValueError, match='cannot run GRUCell'):  # and when a layer runs
    RecurrentLayer(nn.GRUCell(N), scan='fused').init(jax.random.key(0), carry, jnp.ones((T, B, M)))


def _window(seed=1):
  rng = np.random.default_rng(seed)
  xs = jnp.asarray(rng.normal(size=(T, B, M)), jnp.float32)
  carry = tuple(jnp.asarray(rng.normal(size=(B, N)), jnp.float32) for _ in range(2))
  mask = jnp.asarray(rng.binomial(1, 0.7, (B, N)) / 0.7, jnp.float32)
  return carry, xs, mask


class ElmanCell(nn.RNNCellBase):
  """h' = tanh(W x + b + U h), with W x + b computable ahead."""

  features: int
  dtype: Any = None

  def setup(self):
    self.input = nn.Dense(self.features)
    self.recurrent_kernel = self.param(
      'recurrent_kernel', nn.initializers.orthogonal(), (self.features, self.features)
    )

  def project_inputs(self, xs):
    return self.input(xs)

  def step_projected(self, h, projected):
    h = jnp.tanh(projected + h @ self.recurrent_kernel)
    return h, h

  def __call__(self, h, x):
    return self.step_projected(h, self.project_inputs(x))

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    return jnp.zeros((*input_shape[:-1], self.features))

  @property
  def num_feature_axes(self):
    return 1


def test_a_registered_cell_hoists_and_gives_the_plain_scans_outputs(monkeypatch):
  monkeypatch.setitem(REGISTRY, ElmanCell, CellScans())  # unregistered again afterwards
  assert resolve_scan(ElmanCell(N), 'auto') == 'scan'
  register_scans(
    ElmanCell, CellScans(project=ElmanCell.project_inputs, step=ElmanCell.step_projected)
  )
  assert resolve_scan(ElmanCell(N), 'auto') == 'hoisted'
  xs = jax.random.normal(jax.random.key(1), (T, B, M))
  h0 = jnp.tanh(jax.random.normal(jax.random.key(2), (B, N)))
  params = RecurrentLayer(ElmanCell(N)).init(jax.random.key(0), h0, xs)['params']
  run = lambda scan: RecurrentLayer(ElmanCell(N), scan=scan).apply({'params': params}, h0, xs)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), run('hoisted'), run('scan')
  )
  with pytest.raises(ValueError, match='both project and step'):
    register_scans(ElmanCell, CellScans(project=ElmanCell.project_inputs))


def test_a_cell_class_or_name_is_refused_not_resolved_as_an_unknown_cell():
  """resolve_scan(LSTMCell, 'auto') answered 'scan' (LSTMCell(n) runs
  'fused'), and register_scans('elman', ...) registered a string."""
  with pytest.raises(ValueError, match='cell must be a cell instance, such as LSTMCell'):
    resolve_scan(LSTMCell, 'auto')
  with pytest.raises(ValueError, match="cell must be a cell instance, .* got 'lstm'"):
    resolve_scan('lstm', 'fused')
  with pytest.raises(ValueError, match="cell_type must be a cell class, .* got 'elman'"):
    register_scans('elman', CellScans())
  with pytest.raises(ValueError, match='scans must be a CellScans'):
    register_scans(ElmanCell, {'project': None})


LAYERS = {
  **{scan: (LSTMCell(N), scan) for scan in ('scan', 'hoisted', 'fused', 'pallas', 'cudnn')},
  'persistent': (LSTMCell(N, dtype=jnp.bfloat16), 'persistent'),
  'Mogrify fused': (Mogrify(LSTMCell(N), rounds=2), 'fused'),
  'ALSTMCell fused': (ALSTMCell(N, latent_size=2), 'fused'),
}


@pytest.mark.parametrize('rows, width', [(B + 1, N), (1, N), (B, N - 1)], ids=str)
@pytest.mark.parametrize('cell, scan', LAYERS.values(), ids=LAYERS.keys())
def test_a_carry_that_does_not_fit_the_inputs_is_refused_before_any_scan(cell, scan, rows, width):
  """Such a carry failed deep inside JAX ('fused', the step's product), with
  a multi-line scan error at batch 1, or was cut silently ('pallas')."""
  xs = jnp.ones((T, B, M))
  carry = jax.tree.map(
    lambda a: jnp.zeros((rows, width if a.shape[-1] == N else a.shape[-1])),
    cell.initialize_carry(jax.random.key(0), (B, M)),
  )
  fits = (
    rf'\({rows}, {width}\)\) do not fit inputs \({T}, {B}, {M}\): .* expects \(.*\({B}, {N}\)\)'
  )
  with pytest.raises(ValueError, match=rf"carry: its arrays' shapes \(.*{fits}"):
    jax.eval_shape(RecurrentLayer(cell, scan=scan).init, jax.random.key(0), carry, xs)


def test_the_carry_check_costs_nothing_jitted_and_holds_vmapped_over_seeds(monkeypatch):
  """It reads shapes only, at trace time: the traced window is the same
  without it; vmapped over seeds (`--seeds=N`) it sees one seed's carry."""
  carry, xs, _ = _window()
  layer = RecurrentLayer(LSTMCell(N))
  seeds = jax.vmap(lambda key: layer.init(key, carry, xs))(jax.random.split(jax.random.key(0), 2))
  run = lambda variables, carry: layer.apply(variables, carry, xs)
  traced = lambda: str(jax.make_jaxpr(jax.vmap(run, in_axes=(0, None)))(seeds, carry))
  checked = traced()
  monkeypatch.setattr(recurrent, 'check_carry', lambda *args: None)
  assert traced() == checked
  monkeypatch.undo()
  jax.jit(jax.vmap(run, in_axes=(0, None)))(seeds, carry)  # every seed from the same carry
  with pytest.raises(ValueError, match=r"carry: its arrays' shapes \(\(1, 5\), \(1, 5\)\)"):
    jax.jit(jax.vmap(run, in_axes=(0, None)))(seeds, jax.tree.map(lambda a: a[:1], carry))


BATCH_SHAPES = {'unbatched': (), 'two batch axes': (2, 3)}
WINDOWED = {
  'fused': (LSTMCell(N), 'fused', True),
  'pallas': (LSTMCell(N), 'pallas', True),
  'cudnn': (LSTMCell(N), 'cudnn', False),
  'Mogrify fused': (Mogrify(LSTMCell(N), rounds=2), 'fused', True),
  'ALSTMCell fused': (ALSTMCell(N, latent_size=2), 'fused', False),
}


@pytest.mark.parametrize('batch', BATCH_SHAPES.values(), ids=BATCH_SHAPES.keys())
@pytest.mark.parametrize('cell, scan, masked', WINDOWED.values(), ids=WINDOWED.keys())
def test_a_window_kernel_takes_any_batch_axes_as_the_plain_scan(cell, scan, masked, batch):
  """Inputs (T, m) or (T, 2, 3, m), as nn.RNN takes them: the kernels run
  one batch axis, flattened and restored, to the plain scan's outputs and
  carry (and its state mask)."""
  rng = np.random.default_rng(3)
  xs = jnp.asarray(rng.normal(size=(T, *batch, M)), jnp.float32)
  carry = jax.tree.map(
    lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
    cell.initialize_carry(jax.random.key(0), (*batch, M)),
  )
  mask = jnp.asarray(rng.binomial(1, 0.7, (*batch, N)) / 0.7, jnp.float32) if masked else None
  variables = RecurrentLayer(cell, scan='scan').init(jax.random.key(1), carry, xs, mask)
  runs = [
    RecurrentLayer(cell, scan=way).apply(variables, carry, xs, mask) for way in ('scan', scan)
  ]
  for expected, got in zip(*(jax.tree.leaves(run) for run in runs)):
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
  'cell, plain',
  [(LSTMCell(N), ('scan', 'hoisted')), (Mogrify(LSTMCell(N), rounds=2), ('scan',))],
  ids=['LSTMCell', 'Mogrify'],
)
def test_forward_mode_through_a_window_kernel_names_the_scans_that_take_it(cell, plain):
  """jax.jvp through the fused window (a custom VJP) is one line naming the
  window and the scans the cell can take that jvp runs through (bfloat16
  products are a custom VJP on every path); under them jvp gives the
  directional derivative of the fused window's gradient."""
  xs = jax.random.normal(jax.random.key(1), (T, B, M))
  carry = cell.initialize_carry(jax.random.key(0), (B, M))
  params = RecurrentLayer(cell).init(jax.random.key(2), carry, xs)
  direction = jax.tree.map(jnp.ones_like, params)
  loss = lambda scan: lambda p: jnp.sum(RecurrentLayer(cell, scan=scan).apply(p, carry, xs)[1])
  ways = ' or '.join(repr(way) for way in plain)
  message = (
    rf"^the 'fused' window of .* reverse mode only .* scan={ways}, with float32 products(\n|$)"
  )
  with pytest.raises(TypeError, match=message):
    jax.jvp(loss('fused'), (params,), (direction,))
  grads = jax.grad(loss('fused'))(params)
  expected = sum(jnp.sum(g) for g in jax.tree.leaves(grads))  # the gradient along all-ones
  for scan in plain:
    _, derivative = jax.jvp(loss(scan), (params,), (direction,))
    np.testing.assert_allclose(derivative, expected, rtol=1e-5)
