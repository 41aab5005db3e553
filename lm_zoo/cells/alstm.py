"""The adaptive LSTM (Flennerhag et al., NeurIPS 2018, eq. 8) and its
adaptation models: static (eq. 6), recurrent (eq. 7) and the stacked
LSTM-RHN wiring of eq. 9."""

from __future__ import annotations

import numbers
from typing import Any, Callable, ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.base import carry_output, replace_carry_output
from lm_zoo.cells.lstm import (
  LSTMCell,
  check_lstm_carry,
  drawn_wide,
  gate_bias_init,
  lstm_update,
  per_gate_init,
  state_dtype,
)
from lm_zoo.errors import ConfigError, is_whole_number
from lm_zoo.layers.adaptive import AdaptiveDense, split_sizes
from lm_zoo.layers.products import dense


def check_fields(module: nn.Module, sizes: Sequence[str] = (), rates: Sequence[str] = ()) -> None:
  """Raises ValueError naming the first field of `module` among `sizes` that
  is not a whole number >= 1, or among `rates` that is not a dropout rate in
  [0, 1) (flax's `nn.Dropout` would silently zero every value, or scale them down)."""
  cls = type(module).__name__
  for name in sizes:
    value = getattr(module, name)
    if not is_whole_number(value) or value < 1:
      raise ValueError(f'{cls}: {name} must be a whole number >= 1, got {value!r}')
  for name in rates:
    value = getattr(module, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
      raise ValueError(f'{cls}: {name} must be a dropout rate in [0, 1), got {value!r}')


class StaticLatent(nn.RNNCellBase):
  """The static adaptation model of eq. (6): z_t = ReLU(W v_t + b).

  A cell with an empty carry, so that it stands where the recurrent model
  (eq. 7, an `LSTMCell`) does. `dtype` is its product's (`products.dense`).
  """

  features: int
  dtype: Any = None

  def __post_init__(self):
    check_fields(self, sizes=('features',))
    super().__post_init__()

  @nn.compact
  def __call__(self, carry, v: jax.Array):
    return carry, nn.relu(dense(self.features, self.dtype)(v))

  @nn.nowrap
  def hidden_to_hidden(self, of) -> tuple[str, ...]:
    del of
    return ()  # it has no recurrence

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    return ()

  @property
  def num_feature_axes(self) -> int:
    return 1


class ALSTMCell(nn.RNNCellBase):
  """The aLSTM of eq. (8) with IO adaptation. For each gate s in (i, f, j, o):

      u^s = D^(s,4) W^s D^(3) x + D^(s,2) V^s D^(1) h + D^(s,0) b^s

  with the input adaptations D^(1), D^(3) tied across gates (so the four
  gates stay one fused product) and the output and bias adaptations per gate.
  The policies are π = tanh(U z) without bias, from the latent
  z_t = latent(v_t) of the summary v_t = [x_t; h_{t-1}] (plus a `context`
  from another layer in the LSTM-RHN stack), as in the authors' alstm code:
  one vector of size m + 13n split as [x scale m | h scale n | 4n for W |
  4n for V | 4n for the bias]. W, V orthogonal per gate (or, with
  `orthogonal_per_gate=False`, each one orthogonal (4n, ·) matrix over the
  four gates, as the authors' code draws them: entries up to half as
  large), b zero with `forget_bias` on the forget gate.

  The carry is (latent carry, c, h): h last, so state dropout and `Mogrify`
  (an adaptive Mogrifier) apply unchanged.

  `dropout_latent` drops z after the adaptation model, as the authors'
  `aLSTM` does (`dropout_adapt`, their `--dropouta`): the dropped z makes the
  policy and is what the latent carry keeps (so a recurrent adaptation model
  and the layer above in the LSTM-RHN stack read it too). Its mask is drawn
  when the call has a 'dropout' RNG (training and MC dropout; evaluation has
  none) and, under `nn.scan` with that RNG not split over steps (as our
  stacks run cells), it is the same at every step: variational.

  Its window kernels (latent `LSTMCell` or `StaticLatent`: 'fused',
  `alstm_recurrence`, and 'pallas', `pallas_alstm_recurrence`) are
  registered in `lm_zoo.cells.scans`; a cell that draws a latent dropout
  mask runs the plain scan.

  Attributes:
    features: hidden size n.
    latent: the adaptation model, any cell constructor taking `features=`
      and `dtype=`: `LSTMCell` (recurrent, eq. 7) or `StaticLatent` (eq. 6).
    latent_size: the size of z (100 in the paper).
    forget_bias: initial forget-gate bias.
    cap_input_gate: cap the input gate at one minus the forget gate (`LSTMCell`).
    dropout_latent: dropout rate on z (see above).
    orthogonal_per_gate: W and V orthogonal per gate (True), or over the
      four gates at once (False, the authors' code).
    dtype: the products' dtype of the adaptation model, the policy and the
      adaptive layers (None: from the inputs; bfloat16 sums and returns
      float32, `lm_zoo.layers.products`); gates and states stay float32.
    param_dtype: the policy's and the adaptive layers' parameter dtype (the
      adaptation model keeps its own); the carry is float32, or float64 with
      float64 parameters (`state_dtype`).
  """

  features: int
  latent: Callable[..., nn.RNNCellBase] = LSTMCell
  latent_size: int = 100
  forget_bias: float = 1.0
  cap_input_gate: bool = False
  dropout_latent: float = 0.0
  orthogonal_per_gate: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32

  dropout_rates: ClassVar[tuple[str, ...]] = ('dropout_latent',)  # `lm_zoo.cells.base`

  def __post_init__(self):
    check_fields(self, sizes=('features', 'latent_size'), rates=self.dropout_rates)
    # A cell instance is callable too, but is called with (carry, inputs): it
    # failed deep in flax when step built it with features= and dtype=.
    if isinstance(self.latent, nn.Module) or not callable(self.latent):
      raise ValueError(
        'ALSTMCell: latent must be a cell constructor taking features= and dtype= '
        f'(LSTMCell or StaticLatent, the class), got {self.latent!r}'
      )
    super().__post_init__()

  @nn.compact
  def step(self, carry, x: jax.Array, context: jax.Array | None = None):
    """One step with an extra summary input `context` (eq. 9); returns
    (carry, h) like `__call__`."""
    check_lstm_carry(carry, (*x.shape[:-1], self.features), latent=True)
    latent_carry, c, h = carry
    n, m = self.features, x.shape[-1]
    v = jnp.concatenate([x, h] if context is None else [x, h, context], axis=-1)
    latent_carry, z = self.latent(features=self.latent_size, dtype=self.dtype, name='latent')(
      latent_carry, v
    )
    if self.dropout_latent > 0 and self.has_rng('dropout'):
      z = nn.Dropout(self.dropout_latent, deterministic=False, name='latent_dropout')(z)
      if jax.tree.leaves(latent_carry):
        latent_carry = replace_carry_output(latent_carry, z)
    pi = jnp.tanh(
      dense(m + 13 * n, self.dtype, use_bias=False, param_dtype=self.param_dtype, name='policy')(z)
    )
    x_scale, h_scale, w_scale, v_scale, b_scale = split_sizes(pi, (m, n, 4 * n, 4 * n, 4 * n))
    orthogonal = nn.initializers.orthogonal()
    per_gate = self.orthogonal_per_gate
    kernel_init = per_gate_init(orthogonal, n) if per_gate else drawn_wide(orthogonal)
    adaptive = lambda name, **kw: AdaptiveDense(
      4 * n,
      'io',
      kernel_init=kernel_init,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name=name,
      **kw,
    )
    gates = adaptive('input', use_bias=False)(x, policies=(x_scale, w_scale)) + adaptive(
      'recurrent', bias_init=gate_bias_init(n, self.forget_bias)
    )(h, policies=(h_scale, v_scale, b_scale))
    new_c, new_h = lstm_update(gates, c, self.cap_input_gate)
    return (latent_carry, new_c, new_h), new_h

  def __call__(self, carry, inputs: jax.Array):
    return self.step(carry, inputs)

  @nn.nowrap
  def hidden_to_hidden(self, of) -> tuple[str, ...]:
    """V, and the adaptation model's own (weight drop, `lm_zoo.cells.base`)."""
    latent = self.latent(features=self.latent_size, parent=None)
    return ('recurrent/kernel_1', *(f'latent/{path}' for path in of(latent)))

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    key_latent, key_state = jax.random.split(rng)
    # The latent model sees v = [x; h] (and a context): its carry depends only
    # on the batch shape, so any last dimension will do here.
    latent = self.latent(features=self.latent_size, parent=None).initialize_carry(
      key_latent, input_shape
    )
    state = LSTMCell(self.features, param_dtype=self.param_dtype, parent=None).initialize_carry(
      key_state, input_shape
    )
    return (jax.tree.map(lambda a: a.astype(state_dtype(self.param_dtype)), latent), *state)

  @property
  def num_feature_axes(self) -> int:
    return 1


class LSTMRHNStack(nn.RNNCellBase):
  """aLSTM layers wired as the LSTM-RHN of eq. (9), stepped together:

      v^(l)_t = [h^(l-1)_t; h^(l)_{t-1}; z^(l-1)_t],
      h^(0)_t = x_t,  z^(0)_t = z^(L)_{t-1}

  so every layer's adaptation model sees the latent of the layer below, and
  the first layer the top layer's latent of the previous step. The latents
  must be recurrent (their carry ends in z). The carry is the tuple of layer
  carries; the output is the top layer's h. When `deterministic` is False,
  `dropout_hidden` drops each layer's output that feeds the next layer and
  `dropout_state` each layer's fed-back h; under `nn.scan` with the dropout
  key not split over steps (as `RecurrentLayer` runs cells) every step draws
  the same masks, so both are variational.

  Its fused window kernel (`lstm_rhn_recurrence`, layers with latent
  `LSTMCell`) is registered in `lm_zoo.cells.scans`; it draws the same masks.

  Attributes:
    cells: the aLSTM layers, bottom first.
    dropout_hidden: rate on each layer's output that feeds the next layer.
    dropout_state: rate on each layer's fed-back h.
    deterministic: no dropout (evaluation).
  """

  cells: Sequence[ALSTMCell]
  dropout_hidden: float = 0.0
  dropout_state: float = 0.0
  deterministic: bool = True

  def __post_init__(self):
    if not self.cells:
      raise ValueError('LSTMRHNStack: cells must hold at least one ALSTMCell layer, got none')
    for layer, cell in enumerate(self.cells):
      if not isinstance(cell, ALSTMCell):  # __call__ steps each with ALSTMCell.step
        raise ValueError(
          f'LSTMRHNStack: cells must be ALSTMCell layers, and layer {layer} is '
          f'{type(cell).__name__}: wrap it as ALSTMCell(features, latent=...)'
        )
    check_fields(self, rates=('dropout_hidden', 'dropout_state'))
    super().__post_init__()

  @nn.compact
  def __call__(self, carry, inputs: jax.Array):
    if not jax.tree.leaves(carry[-1][0]):
      raise ConfigError(
        'the LSTM-RHN stack needs recurrent latents (for example '
        'LSTMCell), whose carry holds z; StaticLatent has none'
      )
    context, x, new_carry = carry_output(carry[-1][0]), inputs, []
    for layer, (cell, layer_carry) in enumerate(zip(self.cells, carry)):
      if layer > 0:
        x = nn.Dropout(self.dropout_hidden, deterministic=self.deterministic)(x)
      h = nn.Dropout(self.dropout_state, deterministic=self.deterministic)(
        carry_output(layer_carry)
      )
      layer_carry, x = cell.step(replace_carry_output(layer_carry, h), x, context)
      context = carry_output(layer_carry[0])
      new_carry.append(layer_carry)
    return tuple(new_carry), x

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    keys = jax.random.split(rng, len(self.cells))
    return tuple(
      cell.clone(parent=None).initialize_carry(k, input_shape) for cell, k in zip(self.cells, keys)
    )

  @property
  def num_feature_axes(self) -> int:
    return 1
