"""Matrix products in a low-precision operand dtype, summed in float32.

Mixed precision the way GPU and TPU matrix units do it: bfloat16 operands,
float32 sums and float32 results. It is also the fast way on CPUs with
bfloat16 dot instructions (AVX512-BF16, AMX), where XLA's CPU backend runs
a bfloat16 x bfloat16 -> float32 product faster than a float32 one (and one
with a bfloat16 result slower). Every
product of a bfloat16 model goes through `einsum`, forward and backward:
its gradient products take bfloat16 operands too.

With `dtype` None or at least 32 bits wide, `einsum` is the plain product
in the operands' promoted dtype (or `dtype`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.layout import Layout, with_layout_constraint

from lm_zoo.errors import is_whole_number


def product_dtype(dtype: Any, default: Any = None) -> Any:
  """The products' operand dtype `dtype`, or `default`'s where it is None
  (None stays None), as a `jnp.dtype`. Every product dtype in the zoo (a
  cell's or model's `dtype`, a recurrence's `dtype=`) passes here.

  Raises:
    ValueError: `dtype` is not a floating dtype or None (an integer dtype
      ran the products in integers, and gave wrong numbers).
  """
  if dtype is None:
    return None if default is None else jnp.dtype(default)
  try:
    resolved = jnp.dtype(dtype)
  except (TypeError, ValueError):  # not a dtype at all: 'bogus'
    resolved = None
  if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
    got = repr(dtype) if resolved is None else resolved.name
    raise ValueError(
      f'dtype must be a floating dtype (jnp.float32, jnp.bfloat16, ...) or None, got {got}'
    )
  return resolved


def is_low_precision(dtype: Any) -> bool:
  """Whether `dtype` is a floating dtype narrower than float32 (bfloat16, float16)."""
  return dtype is not None and jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4


def accumulation_dtype(dtype: Any) -> Any:
  """float32 for a low-precision `dtype`, else `dtype` itself (None stays None).

  Raises:
    ValueError: `dtype` is not a floating dtype or None (`product_dtype`).
  """
  product_dtype(dtype)
  return jnp.promote_types(dtype, jnp.float32) if is_low_precision(dtype) else dtype


def contract(spec: str, a: jax.Array, b: jax.Array, dtype: Any) -> jax.Array:
  """`jnp.einsum(spec, a, b)` with both operands cast to `dtype` and the sums
  and result in `accumulation_dtype(dtype)` (float32 for bfloat16); for the
  hand-written backward passes (no VJP of its own: `einsum` has one)."""
  accumulate = accumulation_dtype(dtype)
  a, b = a.astype(dtype), b.astype(dtype)
  if is_low_precision(dtype) and _is_matrix_product(spec) and jax.default_backend() == 'cpu':
    return _cpu_contract(spec, a, b, accumulate)
  return jnp.einsum(spec, a, b, preferred_element_type=accumulate)


def _is_matrix_product(spec):
  """Whether `spec` is a product of two matrices summed over one shared index."""
  a_spec, b_spec, out_spec = _specs(spec)
  shared = set(a_spec) & set(b_spec)
  return (
    len(a_spec) == len(b_spec) == len(out_spec) == 2
    and len(shared) == 1
    and not shared & set(out_spec)
  )


def _cpu_contract(spec, a, b, accumulate):
  """A 2-d contraction laid out for XLA's CPU backend, which runs bfloat16
  products in YNNPACK only when the left operand is summed over its last
  axis and both are row-major; otherwise it converts them to float32 (at
  half the speed). So a left operand summed over its first axis (a weight
  gradient: Σ_t x_t g_tᵀ) is transposed in memory first, and the result
  transposed to the order `spec` asks for. XLA would fold a plain transpose
  back into the product, so both are pinned row-major."""
  a_spec, b_spec, out_spec = _specs(spec)
  row_major = Layout((0, 1))
  if a_spec[0] in b_spec and a_spec[0] not in out_spec:
    a, a_spec = with_layout_constraint(a.T, row_major), a_spec[::-1]
  natural = ''.join(i for i in a_spec + b_spec if i in out_spec)  # the product's own order
  out = jnp.einsum(f'{a_spec},{b_spec}->{natural}', a, b, preferred_element_type=accumulate)
  if natural != out_spec:
    out = with_layout_constraint(out, row_major).T
  return out


def _specs(spec: str) -> tuple[str, str, str]:
  inputs, output = spec.replace(' ', '').split('->')
  a, b = inputs.split(',')
  # The gradient's products are the contraction with an operand and the
  # output swapped, which holds when no index is summed within one operand.
  if '.' in spec or not set(a) <= set(b + output) or not set(b) <= set(a + output):
    raise ValueError(
      f'einsum {spec!r}: only explicit two-operand contractions whose '
      'indices each appear in the other operand or the output'
    )
  return a, b, output


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4, 5))
def _low_precision_einsum(spec, a, b, dtype, a_dtype, b_dtype):
  del a_dtype, b_dtype
  return contract(spec, a, b, dtype)


def _low_precision_einsum_fwd(spec, a, b, dtype, a_dtype, b_dtype):
  del a_dtype, b_dtype
  a, b = a.astype(dtype), b.astype(dtype)  # kept in the narrow dtype
  return contract(spec, a, b, dtype), (a, b)


def _low_precision_einsum_bwd(spec, dtype, a_dtype, b_dtype, saved, d_out):
  a, b = saved
  a_spec, b_spec, out_spec = _specs(spec)
  d_a = contract(f'{out_spec},{b_spec}->{a_spec}', d_out, b, dtype)
  d_b = contract(f'{a_spec},{out_spec}->{b_spec}', a, d_out, dtype)
  return d_a.astype(a_dtype), d_b.astype(b_dtype)


_low_precision_einsum.defvjp(_low_precision_einsum_fwd, _low_precision_einsum_bwd)


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype: Any = None) -> jax.Array:
  """The two-operand contraction `spec` (explicit indices, e.g. 'mk,kn->mn').

  For a low-precision `dtype` (`is_low_precision`) the operands are cast to
  it and the product is summed and returned in float32; so are the two
  products of its gradient (the incoming gradient cast to `dtype`), whose
  results come back in the operands' dtypes. Otherwise the plain
  `jnp.einsum` in the operands' promoted dtype, or in `dtype` when given.

  Raises:
    ValueError: `dtype` is not a floating dtype or None (`product_dtype`).
  """
  product_dtype(dtype)
  if not is_low_precision(dtype):
    if dtype is not None:
      a, b = a.astype(dtype), b.astype(dtype)
    return jnp.einsum(spec, a, b)
  _specs(spec)
  return _low_precision_einsum(spec, a, b, jnp.dtype(dtype), np.dtype(a.dtype), np.dtype(b.dtype))


def matmul(a: jax.Array, b: jax.Array, dtype: Any = None) -> jax.Array:
  """a (..., k) @ b (k, n) as `einsum` in `dtype`; the leading axes of a are
  flattened into one (a 2-d product runs faster on XLA's CPU backend)."""
  flat = einsum('mk,kn->mn', a.reshape(-1, a.shape[-1]), b, dtype)
  return flat.reshape(*a.shape[:-1], b.shape[-1])


def attend(x: jax.Array, table: jax.Array, dtype: Any = None) -> jax.Array:
  """x (..., d) against every row of table (v, d): (..., v), as `einsum` in
  `dtype` (a softmax over an embedding-like matrix); the leading axes of x
  are flattened into one, as in `matmul`."""
  flat = einsum('md,vd->mv', x.reshape(-1, x.shape[-1]), table, dtype)
  return flat.reshape(*x.shape[:-1], table.shape[0])


# XLA's GPU backend runs a product summed over a long axis in parts (split-K)
# and pads that axis to a multiple of the parts' tile first. Inside a loop the
# pad is not hoisted out of it: each step of a window would copy each such
# weight whole. So windows pad their weights' summed axes once, before the
# loop, where that adds little.
_ALIGNMENT = {'gpu': 128}
_MAX_ALIGNMENT_OVERHEAD = 1 / 32  # padded rows are read at every step
_alignment_override: list[int] = []


def contraction_alignment() -> int:
  """The multiple to which windows pad their weights' summed axes
  (`aligned_rows`): 128 on a GPU, 1 (none) elsewhere, or what
  `aligned_contractions` sets. A window reads it where it is called and
  passes it on as a static argument, so that JAX's caches of traced
  functions key on it."""
  if _alignment_override:
    return _alignment_override[-1]
  return _ALIGNMENT.get(jax.default_backend(), 1)


@contextlib.contextmanager
def aligned_contractions(multiple: int) -> Iterator[None]:
  """Windows traced inside pad their weights' summed axes to `multiple`
  (1: not at all), on any backend. It is read when a window is traced, and
  JAX caches a traced function by its identity: a function traced before
  (`jax.jit`, `jax.make_jaxpr`) keeps what it was traced with: build and
  first call the train step inside.

  Example::

    with aligned_contractions(1):  # the windows as XLA gets them unpadded
      train_step = make_train_step(model, optimizer)
      state, metrics = train_step(state, inputs, targets, weights)  # traced here
  """
  if not is_whole_number(multiple) or multiple < 1:
    raise ValueError(f'aligned_contractions: multiple must be a positive integer, got {multiple!r}')
  _alignment_override.append(multiple)
  try:
    yield
  finally:
    _alignment_override.pop()


def aligned_size(size: int, multiple: int) -> int:
  """`size` rounded up to `multiple` where that adds at most 1/32, else `size`."""
  padded = -(-size // multiple) * multiple
  return padded if padded - size <= size * _MAX_ALIGNMENT_OVERHEAD else size


def aligned_rows(kernel: jax.Array, multiple: int) -> jax.Array:
  """`kernel` (k, n) with zero rows appended up to `aligned_size(k,
  multiple)`: the weight a window's loop multiplies by, padded once outside
  it."""
  extra = aligned_size(kernel.shape[0], multiple) - kernel.shape[0]
  return jnp.pad(kernel, ((0, extra), (0, 0))) if extra else kernel


def aligned_product(x: jax.Array, kernel: jax.Array, dtype: Any) -> jax.Array:
  """x (B, k) @ kernel (k', n) as `contract` in `dtype`, for a kernel from
  `aligned_rows` (k' >= k): x gains k' - k zero columns, which add nothing."""
  extra = kernel.shape[0] - x.shape[-1]
  if extra:
    x = jnp.pad(x, ((0, 0), (0, extra)))
  return contract('bk,kn->bn', x, kernel, dtype)


def dense_dot_general(dtype: Any):
  """A `dot_general` for `flax.linen.Dense(dot_general=...)` whose products
  are `matmul`s in `dtype` (give the Dense the float32 dtype then, so that
  its bias is added in float32)."""

  def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    del precision, preferred_element_type  # set by `dtype`
    if dimension_numbers != (((lhs.ndim - 1,), (0,)), ((), ())):
      raise ValueError(f'dense_dot_general: unsupported dimension numbers {dimension_numbers}')
    return matmul(lhs, rhs, dtype)

  return dot_general


def linear(x: jax.Array, kernel: jax.Array, bias: jax.Array, dtype: Any = None) -> jax.Array:
  """What `dense(features, dtype)` computes from its kernel and bias, for
  kernels that take parameters explicitly: x @ kernel + b, the product a
  `matmul` in `dtype` and the bias added in `accumulation_dtype(dtype)`."""
  x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=accumulation_dtype(dtype))
  y = matmul(x, kernel, dtype)
  return y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))


def dense(features: int, dtype: Any = None, **kwargs) -> nn.Dense:
  """`nn.Dense(features, **kwargs)` whose product is a `matmul` in `dtype`
  and whose bias is added in `accumulation_dtype(dtype)` (float32 for
  bfloat16): every dense layer of a model with `dtype` set is built so."""
  return nn.Dense(
    features, dtype=accumulation_dtype(dtype), dot_general=dense_dot_general(dtype), **kwargs
  )
