"""The multiplicative LSTM (Krause et al. 2016), the Mogrifier's closest relative."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.lstm import LSTMCell, check_lstm_carry
from lm_zoo.layers.products import dense


class MLSTMCell(nn.RNNCellBase):
  """mLSTM(x, c, h) = LSTM(x, c, h_m) with h_m = (W_mx x) ⊙ (W_mh h).

  The intermediate state h_m replaces h in the LSTM's gates; the carry is
  `(c, h)` as for `LSTMCell`, whose parameters live under `lstm`.

  Attributes:
    features: hidden size n (also the size of h_m).
    forget_bias: the inner LSTM's initial forget-gate bias.
    cap_input_gate: the inner LSTM's capped input gate (`LSTMCell`).
    dtype, param_dtype: as for `LSTMCell`.
  """

  features: int
  forget_bias: float = 1.0
  cap_input_gate: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, carry, inputs: jax.Array):
    check_lstm_carry(carry, (*inputs.shape[:-1], self.features))
    c, h = carry
    factor = lambda name: dense(
      self.features, self.dtype, use_bias=False, param_dtype=self.param_dtype, name=name
    )
    h_m = factor('mx')(inputs) * factor('mh')(h)
    return LSTMCell(
      self.features,
      self.forget_bias,
      self.cap_input_gate,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name='lstm',
    )((c, h_m), inputs)

  @nn.nowrap
  def hidden_to_hidden(self, of) -> tuple[str, ...]:
    """The inner LSTM's U (weight drop, `lm_zoo.cells.base`); W_mh, which
    also reads h, is not dropped."""
    del of  # its LSTM is built inside, not wrapped
    return ('lstm/recurrent_kernel',)

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    return LSTMCell(self.features, param_dtype=self.param_dtype, parent=None).initialize_carry(
      rng, input_shape
    )

  @property
  def num_feature_axes(self) -> int:
    return 1
