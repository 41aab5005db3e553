"""What the step kernels share: where they run (compiled on a GPU,
interpreted elsewhere), the products' precision, a float32-summed product,
and for kernels whose programs own whole rows (every column of a value is
needed before the next value: the Mogrifier's rounds, the aLSTM's latent and
policy) the program's chunked loops, its barrier and the call over batch
tiles."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def interpret_default() -> bool:
  """Pallas runs compiled on a GPU and interpreted everywhere else."""
  return jax.default_backend() != 'gpu'


def check_interpret(interpret: Any) -> None:
  """Raises ValueError unless `interpret` is a bool or None: Pallas takes any
  truthy value as True, so interpret='no' ran interpreted."""
  if interpret is not None and not isinstance(interpret, bool):
    raise ValueError(
      "interpret must be True (Pallas' interpreter), False (compiled for a GPU) or None "
      f'(interpreted off a GPU only), got {interpret!r}'
    )


def resolve_interpret(interpret: bool | None) -> bool:
  """`interpret` checked, None meaning `interpret_default()`."""
  check_interpret(interpret)
  return interpret_default() if interpret is None else interpret


def precision_for(dtype: Any) -> jax.lax.Precision:
  """The products' precision: float32 operands follow JAX's default matmul
  precision (TF32 on NVIDIA GPUs unless it is 'highest', as XLA's products
  do); narrower operands are multiplied as they are."""
  wanted = jax.config.jax_default_matmul_precision
  if jnp.dtype(dtype).itemsize >= 4 and wanted in ('highest', 'float32'):
    return jax.lax.Precision.HIGHEST
  return jax.lax.Precision.DEFAULT


def compiler_params(tiles, interpret: bool):
  """Triton's parameters for `tiles` (its `num_warps`); none when interpreted."""
  if interpret:
    return None
  from jax.experimental.pallas import triton as pl_triton

  return pl_triton.CompilerParams(num_warps=tiles.num_warps, num_stages=2)


def sigmoid(x):
  return 0.5 * jnp.tanh(0.5 * x) + 0.5


def gate_update(gates, c, cap_input_gate: bool):
  """The LSTM's update from its four pre-activations and c_{t-1}.

  Returns:
    ((σ(i), σ(f), tanh(j), σ(o)), c_t, h_t); with `cap_input_gate` the cell
    writes with min(1 - σ(f), σ(i)) (the activations keep σ(i)).
  """
  i, f, j, o = sigmoid(gates[0]), sigmoid(gates[1]), jnp.tanh(gates[2]), sigmoid(gates[3])
  written = jnp.minimum(1 - f, i) if cap_input_gate else i
  c = f * c + written * j
  return (i, f, j, o), c, o * jnp.tanh(c)


def product(a, b, dtype, precision, transpose_b=False):
  """a b (or a bᵀ) with operands in `dtype`, summed in float32."""
  dims = (((1,), (1 if transpose_b else 0,)), ((), ()))
  return jax.lax.dot_general(
    a.astype(dtype), b.astype(dtype), dims, precision=precision, preferred_element_type=jnp.float32
  )


def shifted_columns(cols, offset: int):
  """The column slice `cols` moved right by `offset` (a block of a wider row)."""
  return cols if not offset else pl.ds(cols.start + offset, cols.size)


class RowProgram:
  """What the body of a program that owns whole rows needs: its rows, the
  chunk its loops step by, the products' dtype, and the barrier.

  Attributes:
    rows: the rows a program owns.
    chunk: the columns each loop iteration covers.
    dtype: the products' operand dtype (bfloat16 sums in float32).
    interpret: whether the kernel runs in Pallas' interpreter (no barrier).
  """

  def __init__(self, rows: int, chunk: int, dtype: Any, interpret: bool):
    self.rows, self.chunk, self.dtype = rows, chunk, dtype
    self.precision = precision_for(dtype)
    self.interpret = interpret

  def cols(self, k):
    return pl.ds(pl.multiple_of(k * self.chunk, self.chunk), self.chunk)

  def barrier(self):
    """Past here, every thread of the program sees what the others wrote."""
    if not self.interpret:
      from jax.experimental.pallas import triton as pl_triton

      pl_triton.debug_barrier()

  def each_chunk(self, width: int, body: Callable):
    def step(k, carry):
      body(self.cols(k))
      return carry

    jax.lax.fori_loop(0, width // self.chunk, step, 0)

  def summed(self, width: int, shape, term: Callable):
    """Σ over the chunks of `width` of term(cols), each of `shape`."""
    return jax.lax.fori_loop(
      0,
      width // self.chunk,
      lambda k, total: total + term(self.cols(k)),
      jnp.zeros(shape, jnp.float32),
    )

  def product(self, a, b, transpose_b=False):
    return product(a, b, self.dtype, self.precision, transpose_b)


def call_by_rows(kernel, name: str, row_inputs, weights, outs, tiles, interpret: bool):
  """A pallas_call over batch tiles: `row_inputs` and (B, ...) outputs by rows,
  the weights whole; scratch outputs shaped (slots, B, width) by rows too."""

  def by_rows(shape):
    block = (tiles.batch, *shape[1:]) if len(shape) == 2 else (shape[0], tiles.batch, shape[2])
    index = (lambda b: (b, 0)) if len(shape) == 2 else (lambda b: (0, b, 0))
    return pl.BlockSpec(block, index)

  whole = lambda a: pl.BlockSpec(a.shape, lambda b: (0,) * a.ndim)
  batch = row_inputs[0].shape[0]
  return pl.pallas_call(
    kernel,
    grid=(batch // tiles.batch,),
    in_specs=[by_rows(a.shape) for a in row_inputs] + [whole(w) for w in weights],
    out_specs=[by_rows(o.shape) for o in outs],
    out_shape=outs,
    compiler_params=compiler_params(tiles, interpret),
    interpret=interpret,
    name=name,
  )(*row_inputs, *weights)
