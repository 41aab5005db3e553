"""products: bfloat16 operands with float32 sums, forward and backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxprs import dot_equations

from lm_zoo.layers.products import (
  aligned_contractions,
  aligned_product,
  aligned_rows,
  aligned_size,
  attend,
  contraction_alignment,
  dense_dot_general,
  einsum,
  is_low_precision,
  matmul,
  product_dtype,
)
from lm_zoo.layers.products import dense as products_dense


def _rounded(x):
  """x rounded to bfloat16, as float64 for NumPy."""
  return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def _operands(spec, seed=0):
  sizes = {'m': 5, 'k': 7, 'n': 3, 'v': 6}
  a_spec, rest = spec.split(',')
  b_spec = rest.split('->')[0]
  keys = jax.random.split(jax.random.key(seed))
  return (
    jax.random.normal(keys[0], [sizes[c] for c in a_spec]),
    jax.random.normal(keys[1], [sizes[c] for c in b_spec]),
  )


@pytest.mark.parametrize('spec', ['mk,kn->mn', 'mk,vk->mv'])
def test_bfloat16_product_and_gradients_are_float32_sums_of_rounded_operands(spec):
  """Forward: the exact product of the bf16-rounded operands (float32 sums of
  bf16 x bf16 terms are exact to float32 rounding). Backward: the same for
  the incoming gradient rounded to bf16, against NumPy's products."""
  a, b = _operands(spec)
  d_out = jax.random.normal(jax.random.key(2), einsum(spec, a, b).shape)
  out, vjp = jax.vjp(lambda a, b: einsum(spec, a, b, jnp.bfloat16), a, b)
  d_a, d_b = vjp(d_out)
  assert out.dtype == d_a.dtype == d_b.dtype == jnp.float32
  a_spec, rest = spec.split(',')
  b_spec, out_spec = rest.split('->')
  ra, rb, rg = _rounded(a), _rounded(b), _rounded(d_out)
  np.testing.assert_allclose(out, np.einsum(spec, ra, rb), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    d_a, np.einsum(f'{out_spec},{b_spec}->{a_spec}', rg, rb), rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    d_b, np.einsum(f'{a_spec},{out_spec}->{b_spec}', ra, rg), rtol=1e-6, atol=1e-6
  )
  # and it is not the float32 product: the rounding shows
  assert np.abs(np.asarray(out) - np.einsum(spec, np.asarray(a), np.asarray(b))).max() > 1e-4


def test_bfloat16_jaxpr_multiplies_bfloat16_operands_into_float32():
  a, b = _operands('mk,kn->mn')
  jaxpr = jax.make_jaxpr(
    jax.grad(lambda a, b: einsum('mk,kn->mn', a, b, jnp.bfloat16).sum(), argnums=(0, 1))
  )(a, b).jaxpr
  dots = dot_equations(jaxpr)
  assert len(dots) == 3  # the product and its two gradient products
  for eqn in dots:
    assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16, jnp.bfloat16]
    assert eqn.outvars[0].aval.dtype == jnp.float32


@pytest.mark.parametrize('dtype', [None, jnp.float32])
def test_full_precision_is_the_plain_einsum(dtype):
  a, b = _operands('mk,vk->mv')
  np.testing.assert_array_equal(einsum('mk,vk->mv', a, b, dtype), jnp.einsum('mk,vk->mv', a, b))
  np.testing.assert_array_equal(
    jax.grad(lambda a: einsum('mk,vk->mv', a, b, dtype).sum())(a),
    jax.grad(lambda a: jnp.einsum('mk,vk->mv', a, b).sum())(a),
  )


def test_low_precision_dtypes():
  assert is_low_precision(jnp.bfloat16) and is_low_precision('float16')
  assert not any(map(is_low_precision, [None, jnp.float32, jnp.float64, jnp.int8]))


def test_matmul_flattens_leading_axes():
  a = jax.random.normal(jax.random.key(0), (2, 3, 4))
  b = jax.random.normal(jax.random.key(1), (4, 5))
  out = matmul(a, b, jnp.bfloat16)
  assert out.shape == (2, 3, 5)
  np.testing.assert_allclose(out, _rounded(a) @ _rounded(b), rtol=1e-6, atol=1e-6)


def test_attend_scores_every_row_of_the_table():
  x = jax.random.normal(jax.random.key(0), (2, 3, 4))
  table = jax.random.normal(jax.random.key(1), (5, 4))
  out = attend(x, table, jnp.bfloat16)
  assert out.shape == (2, 3, 5) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, _rounded(x) @ _rounded(table).T, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    attend(x, table), np.asarray(x) @ np.asarray(table).T, rtol=1e-5, atol=1e-5
  )


def test_dense_multiplies_rounded_operands_and_adds_its_bias_in_float32():
  dense = products_dense(3, jnp.bfloat16)
  x = jax.random.normal(jax.random.key(0), (4, 5))
  params = dense.init(jax.random.key(1), x)['params']
  params = {**params, 'bias': jnp.array([1e-3, 1.0, 1000.0])}
  y = dense.apply({'params': params}, x)
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(
    y, _rounded(x) @ _rounded(params['kernel']) + np.asarray(params['bias']), rtol=1e-6, atol=1e-6
  )


def test_unsupported_contractions_are_named():
  a, b = _operands('mk,kn->mn')
  with pytest.raises(ValueError, match='two-operand contractions'):
    einsum('mk,kn->m', a, b, jnp.bfloat16)
  with pytest.raises(ValueError, match='unsupported dimension numbers'):
    dense_dot_general(jnp.bfloat16)(a, b, (((0,), (0,)), ((), ())))


def test_aligned_sizes_round_up_only_where_that_adds_at_most_a_32nd():
  # the paper aLSTM's summed axes, one already aligned, and two that would
  # grow by more than 1/32
  sizes = (1150, 1650, 4600, 6350, 15350, 1152, 400, 100)
  assert [aligned_size(k, 128) for k in sizes] == [1152, 1664, 4608, 6400, 15360, 1152, 400, 100]
  assert [aligned_size(k, 1) for k in sizes] == list(sizes)


def test_the_alignment_is_none_on_a_cpu_unless_set():
  assert contraction_alignment() == 1
  with aligned_contractions(128):
    assert contraction_alignment() == 128
    with aligned_contractions(1):
      assert contraction_alignment() == 1
    assert contraction_alignment() == 128
  assert contraction_alignment() == 1


def test_an_aligned_product_equals_the_plain_product():
  x, kernel = (
    jax.random.normal(jax.random.key(0), (3, 63)),
    jax.random.normal(jax.random.key(1), (63, 5)),
  )
  padded = aligned_rows(kernel, 64)
  assert padded.shape == (64, 5) and not np.any(padded[63:])
  np.testing.assert_allclose(aligned_product(x, padded, jnp.float32), x @ kernel, rtol=1e-6)
  assert aligned_rows(kernel, 1) is kernel


@pytest.mark.parametrize('multiple', [0, -128, 1.5, '128', True])
def test_an_alignment_that_is_no_positive_integer_is_refused(multiple):
  with pytest.raises(
    ValueError, match=f'aligned_contractions: multiple must be a positive integer, got {multiple!r}'
  ):
    with aligned_contractions(multiple):
      pass


ENTRIES = (
  'einsum',
  'dense',
  'LSTMCell scan',
  'LSTMCell fused',
  'Mogrify rounds',
  'ALSTMCell',
  'lstm_recurrence',
  'pallas_lstm_recurrence',
)


def _entries():
  """Where a product dtype enters: the products, a cell's `dtype`, the
  recurrences' `dtype=`; each as call(dtype), traced for shapes only."""
  from lm_zoo.cells import ALSTMCell, LSTMCell, Mogrify
  from lm_zoo.cells.lstm_recurrence import lstm_recurrence
  from lm_zoo.cells.pallas_lstm import pallas_lstm_recurrence
  from lm_zoo.models import RecurrentLayer

  a, b = _operands('mk,kn->mn')
  projected, kernel = jnp.zeros((3, 2, 8)), jnp.zeros((2, 8))
  carry = (jnp.zeros((2, 2)), jnp.zeros((2, 2)))

  def layer(cell, scan):
    xs = jnp.zeros((3, 2, 4))
    init = RecurrentLayer(cell, scan=scan).init
    return lambda: init(jax.random.key(0), cell.initialize_carry(jax.random.key(0), (2, 4)), xs)

  return {
    'einsum': lambda dtype: lambda: einsum('mk,kn->mn', a, b, dtype),
    'dense': lambda dtype: lambda: products_dense(3, dtype).init(jax.random.key(0), a),
    'LSTMCell scan': lambda dtype: layer(LSTMCell(2, dtype=dtype), 'scan'),
    'LSTMCell fused': lambda dtype: layer(LSTMCell(2, dtype=dtype), 'fused'),
    'Mogrify rounds': lambda dtype: layer(Mogrify(LSTMCell(2), rounds=2, dtype=dtype), 'fused'),
    'ALSTMCell': lambda dtype: layer(ALSTMCell(2, latent_size=2, dtype=dtype), 'fused'),
    'lstm_recurrence': lambda dtype: lambda: lstm_recurrence(projected, kernel, carry, dtype=dtype),
    'pallas_lstm_recurrence': lambda dtype: (
      lambda: pallas_lstm_recurrence(projected, kernel, carry, dtype=dtype)
    ),
  }


@pytest.mark.parametrize(
  'dtype, got',
  [(jnp.int32, 'int32'), (jnp.bool_, 'bool'), ('complex64', 'complex64'), ('bogus', "'bogus'")],
)
@pytest.mark.parametrize('entry', ENTRIES)
def test_a_product_dtype_that_is_not_floating_is_refused_naming_dtype(entry, dtype, got):
  """int32 ran the products in integers (wrong numbers, zeros in Pallas);
  'bogus' gave NumPy's TypeError naming no argument."""
  with pytest.raises(
    ValueError, match=rf'^dtype must be a floating dtype .* or None, got {got}(\n|$)'
  ):
    jax.eval_shape(_entries()[entry](dtype))


def test_the_product_dtype_is_the_given_one_else_the_default():
  assert set(_entries()) == set(ENTRIES)
  assert product_dtype(None) is None and product_dtype('bfloat16') == jnp.bfloat16
  assert product_dtype(None, jnp.float16) == jnp.float16
  assert product_dtype(jnp.float32, jnp.bfloat16) == jnp.float32
