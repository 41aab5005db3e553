"""The LSTM cell (docs/models.md §1), the base cell of every model in the zoo."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.errors import is_whole_number
from lm_zoo.layers.products import dense, matmul

Initializer = Callable[..., jax.Array]


def per_gate_init(init: Initializer, features: int) -> Initializer:
  """Initialises each gate's (rows, features) block of a fused (rows, 4 features)
  kernel on its own (orthogonal per gate), drawn in float32 or wider and
  rounded to `dtype` (a QR takes no bfloat16)."""

  def init_fn(key, shape, dtype=jnp.float32):
    keys = jax.random.split(key, 4)
    drawn = state_dtype(dtype)
    blocks = [init(k, (shape[0], features), drawn) for k in keys]
    return jnp.concatenate(blocks, axis=-1).astype(dtype)

  return init_fn


def drawn_wide(init: Initializer) -> Initializer:
  """`init` over the whole kernel, drawn in float32 or wider and rounded to
  `dtype`, as `per_gate_init` draws each block."""

  def init_fn(key, shape, dtype=jnp.float32):
    return init(key, shape, state_dtype(dtype)).astype(dtype)

  return init_fn


def state_dtype(param_dtype: Any) -> Any:
  """The dtype of an LSTM's gates and states for parameters of
  `param_dtype`: float32, or wider parameters' dtype."""
  return jnp.promote_types(param_dtype, jnp.float32)


def gate_bias_init(features: int, forget_bias: float) -> Initializer:
  """Zero gate biases (order i, f, j, o) with `forget_bias` on the forget gate."""

  def init_fn(key, shape, dtype=jnp.float32):
    del key
    return jnp.zeros(shape, dtype).at[features : 2 * features].set(forget_bias)

  return init_fn


def lstm_update(
  gates: jax.Array, c: jax.Array, cap_input_gate: bool = False
) -> tuple[jax.Array, jax.Array]:
  """(c', h') from the pre-activations [i, f, j, o] (..., 4n) and c; with
  `cap_input_gate` the input gate is min(1 - σ(f), σ(i)) (lamb)."""
  i, f, j, o = jnp.split(gates, 4, axis=-1)
  forget, write = nn.sigmoid(f), nn.sigmoid(i)
  if cap_input_gate:
    write = jnp.minimum(1 - forget, write)
  new_c = forget * c + write * jnp.tanh(j)
  return new_c, nn.sigmoid(o) * jnp.tanh(new_c)


def _described(carry) -> str:
  """What a carry is, for a refusal: 'an array of shape (2, 8)', 'a tuple of shapes ((2, 8),)'."""
  if hasattr(carry, 'shape'):
    return f'an array of shape {tuple(carry.shape)}'
  if isinstance(carry, (tuple, list)):
    shapes = tuple(tuple(x.shape) if hasattr(x, 'shape') else type(x).__name__ for x in carry)
    return f'a {type(carry).__name__} of shapes {shapes}'
  return repr(carry)


def check_lstm_carry(carry, shape: tuple[int, ...], latent: bool = False) -> None:
  """Raises ValueError unless `carry` is a (c, h) pair of arrays of `shape`,
  or with `latent` (the aLSTM's) a (latent carry, c, h) triple: `c, h =
  carry` would unpack the rows of a single (2, n) array and run on, and a c
  of width 1 would broadcast against the gates."""
  size, form = 2, 'a (c, h) pair of arrays'
  if latent:
    size, form = 3, '(latent carry, c, h), c and h arrays'
  whole = isinstance(carry, (tuple, list)) and len(carry) == size
  if not (whole and all(tuple(getattr(x, 'shape', ())) == shape for x in carry[-2:])):
    raise ValueError(
      f'carry must be {form} of shape {shape}, as '
      f'cell.initialize_carry(rng, input_shape) makes, got {_described(carry)}'
    )


def gate_bias(params) -> jax.Array:
  """An `LSTMCell`'s gate bias from its parameters: b, plus b_h where the
  cell has one (`recurrent_bias`)."""
  bias = params['input']['bias']
  return bias + params['recurrent_bias'] if 'recurrent_bias' in params else bias


class LSTMCell(nn.RNNCellBase):
  """LSTM with the carry `(c, h)` and output h:

      [i, f, j, o] = W x + U h + b     (+ b_h with `recurrent_bias`)
      c' = σ(f) ⊙ c + σ(i) ⊙ tanh(j),   h' = σ(o) ⊙ tanh(c')

  or, with `cap_input_gate`, c' = σ(f) ⊙ c + min(1 - σ(f), σ(i)) ⊙ tanh(j):
  the input gate capped at one minus the forget gate, which keeps c in
  [-1, 1] (lamb's `tiled_lstm.py`; every published Mogrifier-paper config
  sets it). With `recurrent_bias` the cell has a second gate bias b_h, as
  the authors' Torch code for Zaremba et al. (2014) has it (main.lua: an
  `nn.Linear` with its bias for x and another for h): the same function of
  b + b_h, but each bias takes the whole gradient, so plain SGD moves the
  gates' bias at twice the rate, and where every parameter is drawn
  uniformly (`model.init='uniform'`, as main.lua does) it starts as the sum of
  two draws. Gate order in the fused (…, 4n) parameters is i, f, j, o. The
  forget-gate bias starts at `forget_bias` (+1 as in alstm and lamb). W x
  can be computed for all time steps at once (`project_inputs`) and fed to
  `step_projected`, which is what our stacks do; `__call__` does both for
  one step, so the cell also runs in `nn.RNN`. Its fused window kernels
  (`lstm_recurrence`, and `mixed_lstm_recurrence` inside `Mogrify`) are
  registered in `lm_zoo.cells.scans`.

  Attributes:
    features: the hidden size n.
    forget_bias: added to the forget gate's initial bias.
    cap_input_gate: cap σ(i) at 1 - σ(f) (see above).
    recurrent_bias: a second gate bias b_h (see above), starting at zero.
    kernel_init: initialiser of W (m, 4n), applied per gate.
    recurrent_kernel_init: initialiser of U (n, 4n), applied per gate.
    dtype: computation dtype (None: from the inputs). bfloat16 is mixed
      precision: the products take bfloat16 operands and sum in float32
      (`products.einsum`), the gates and states are float32.
    param_dtype: parameter dtype; the carry is float32, or float64 with
      float64 parameters (`state_dtype`).
    carry_init: initialiser of the initial carry.
  """

  features: int
  forget_bias: float = 1.0
  cap_input_gate: bool = False
  recurrent_bias: bool = False
  kernel_init: Initializer = nn.initializers.lecun_normal()
  recurrent_kernel_init: Initializer = nn.initializers.orthogonal()
  dtype: Any = None
  param_dtype: Any = jnp.float32
  carry_init: Initializer = nn.initializers.zeros_init()

  def __post_init__(self):
    if not is_whole_number(self.features) or self.features < 1:
      raise ValueError(f'features must be a whole number >= 1, got {self.features!r}')
    super().__post_init__()

  def setup(self):
    n = self.features
    self.recurrent_kernel = self.param(
      'recurrent_kernel', per_gate_init(self.recurrent_kernel_init, n), (n, 4 * n), self.param_dtype
    )
    # W and b live in a Dense so that the input size is inferred on first use.
    self.input = dense(
      4 * n,
      self.dtype,
      kernel_init=per_gate_init(self.kernel_init, n),
      bias_init=gate_bias_init(n, self.forget_bias),
      param_dtype=self.param_dtype,
    )
    if self.recurrent_bias:
      self.bias_h = self.param(
        'recurrent_bias', nn.initializers.zeros_init(), (4 * n,), self.param_dtype
      )

  def project_inputs(self, inputs: jax.Array) -> jax.Array:
    """W x + b (+ b_h) for any leading shape (all time steps at once)."""
    # One 2-d product: XLA's CPU backend runs it faster than the 3-d one and
    # its weight gradient needs no transposed copy.
    flat = self.input(inputs.reshape(-1, inputs.shape[-1]))
    if self.recurrent_bias:  # b_h is constant over time, so it joins b here
      flat = flat + self.bias_h.astype(flat.dtype)
    return flat.reshape(*inputs.shape[:-1], flat.shape[-1])

  def step_projected(self, carry, projected: jax.Array):
    """One step given W x + b (+ b_h); returns ((c', h'), h')."""
    check_lstm_carry(carry, (*projected.shape[:-1], self.features))
    c, h = carry
    new_c, new_h = lstm_update(
      projected + matmul(h, self.recurrent_kernel, self.dtype), c, self.cap_input_gate
    )
    return (new_c, new_h), new_h

  def __call__(self, carry, inputs: jax.Array):
    return self.step_projected(carry, self.project_inputs(inputs))

  @nn.nowrap
  def hidden_to_hidden(self, of) -> tuple[str, ...]:
    """U is the hidden-to-hidden matrix (weight drop, `lm_zoo.cells.base`)."""
    del of  # wraps no cell
    return ('recurrent_kernel',)

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    batch_dims = input_shape[:-1]
    key_c, key_h = jax.random.split(rng)
    shape = (*batch_dims, self.features)
    dtype = state_dtype(self.param_dtype)
    return (self.carry_init(key_c, shape, dtype), self.carry_init(key_h, shape, dtype))

  @property
  def num_feature_axes(self) -> int:
    return 1
