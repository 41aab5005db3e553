"""`Mogrify(LSTMCell)`'s window with its forward pass and its backward chain
each one persistent Mosaic GPU kernel (Hopper; `lm_zoo.kernels.persistent_mogrifier`,
`persistent_mogrifier_backward`), the weight gradients the fused window's
products over the window (`mixed_lstm_recurrence` with `forward=` and
`backward=`).

The forward kernel runs every round and the LSTM update of every step of
the window in one launch and keeps what the backward pass reads (the gate
activations, c_t, [x^↑, h^↑] and the rounds' gates and low-rank hiddens);
XLA then computes what is elementwise over the window (`chain_factors`),
and the backward kernel runs the chain in reverse in one launch. Values and
gradients are the fused window's with bfloat16 products:
`mixed_lstm_recurrence` with ``dtype=jnp.bfloat16`` and
`MogrifierRounds(..., dtype=jnp.bfloat16)`. Evaluation, dynamic evaluation
and generation run the forward kernel alone. Low-rank rounds only, a batch
of at most 64 and no held steps; on a GPU compiled ('persistent'),
elsewhere interpreted a launch a phase (exact, slow: for tests;
`lm_zoo.cells.persistent_lstm.where_it_runs`).

Example::

  carry, hs = persistent_mogrified_lstm_window(cell, params, carry, inputs, mask)
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.cells.lstm import gate_bias
from lm_zoo.cells.lstm_recurrence import backward_factors, shifted
from lm_zoo.cells.mixed_lstm_recurrence import mixed_lstm_recurrence
from lm_zoo.cells.mogrifier import MogrifierRounds, Mogrify, mogrify_rounds, round_name
from lm_zoo.cells.persistent_lstm import check_settings
from lm_zoo.cells.window_kernels import check_persistent_window, persistent_refusal
from lm_zoo.layers.products import product_dtype


def chain_factors(inputs, carry, state_mask, hs, per_step, mix: MogrifierRounds, cap_input_gate):
  """What `persistent_mogrifier_backward` takes of the forward pass, computed
  for the whole window at once (elementwise): the cell update's factors
  (`backward_factors`), h_0..h_{T-1}, and per round (prev_i, g_i): the value
  it gated and its gate, the rounds rebuilt from x_t, m ⊙ h_{t-1} and the
  kept gates (`mixed_lstm_forward`'s residuals)."""
  (c0, h0), (acts, cs, _, residuals) = carry, per_step
  h_prev = shifted(h0, hs)
  widths = [inputs.shape[-1] if i % 2 else h0.shape[-1] for i in range(1, mix.rounds + 1)]
  gates = jnp.split(residuals[..., : sum(widths)], list(itertools.accumulate(widths))[:-1], -1)
  kept = lambda i, _: (gates[i - 1], None)
  _, _, trace = mogrify_rounds(inputs, h_prev * state_mask, kept, mix.rounds, mix.zigzag)
  factors = backward_factors(acts, cs, c0, cap_input_gate)
  return factors, h_prev, [(gated, gate) for _, gated, gate, _ in trace]


def _round_params(mix: MogrifierRounds, mix_params) -> list:
  return [mix_params[round_name(i)] for i in range(1, mix.rounds + 1)]


def _float32(tree):
  return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


@dataclasses.dataclass(frozen=True)
class PersistentMogrifierKernels:
  """`mixed_lstm_recurrence`'s `ForwardPass` (`forward`) and `BackwardChain`
  (`backward`) through the persistent kernels, in their `mode` and
  `interpret` (`lm_zoo.cells.persistent_lstm.where_it_runs`) over `blocks`
  blocks (None: one per 8 units). The kernels compute in float32; the
  results come back in the dtypes the scans give."""

  mode: str
  interpret: Any
  blocks: int | None = None

  def __post_init__(self):
    check_settings(self.blocks, self.mode, self.interpret)

  def _settings(self, mix: MogrifierRounds) -> dict:
    return dict(zigzag=mix.zigzag, blocks=self.blocks, mode=self.mode, interpret=self.interpret)

  def forward(self, mix, mix_params, weights, inputs, carry, state_mask, cap_input_gate):
    # Imported here: Mosaic GPU adds a quarter of a second to importing lm_zoo.cells.
    from lm_zoo.kernels.persistent_mogrifier import persistent_mogrifier_forward

    c0, h0 = carry
    hs, (c, h), per_step = persistent_mogrifier_forward(
      _float32(inputs),
      _round_params(mix, mix_params),
      *weights,
      _float32(h0),
      _float32(c0),
      state_mask=_float32(state_mask),
      cap_input_gate=cap_input_gate,
      **self._settings(mix),
    )
    return hs.astype(h0.dtype), (c.astype(c0.dtype), h.astype(h0.dtype)), per_step

  def backward(
    self, mix, mix_params, weights, inputs, carry, state_mask, hs, per_step, cotangents, cap
  ):
    from lm_zoo.kernels.persistent_mogrifier_backward import persistent_mogrifier_backward

    input_kernel, _, recurrent_kernel = weights
    mask = _float32(state_mask)
    factors = chain_factors(
      _float32(inputs), _float32(carry), mask, _float32(hs), per_step, mix, cap
    )
    (d_c0, d_h0, d_mask), (d_gates, d_inputs, stashes) = persistent_mogrifier_backward(
      _float32(cotangents),
      *factors,
      _round_params(mix, mix_params),
      input_kernel,
      recurrent_kernel,
      mask,
      **self._settings(mix),
    )
    c0, h0 = carry
    firsts = (d_c0.astype(c0.dtype), d_h0.astype(h0.dtype), d_mask.astype(state_mask.dtype))
    return firsts, (d_gates, d_inputs.astype(inputs.dtype), stashes)


def persistent_mogrifier_refusal(cell: Mogrify) -> str | None:
  """Why the persistent kernel cannot run `cell`'s layer (bfloat16 products
  and low-rank rounds only), or None if it can."""
  lstm = persistent_refusal(cell.cell)
  if lstm is not None:
    return lstm
  dtype = product_dtype(cell.dtype)
  if dtype != jnp.bfloat16:
    name = "the inputs' dtype" if dtype is None else dtype.name
    return (
      f'the persistent kernel multiplies the rounds in bfloat16 only, not {name}: '
      "set model.dtype=bfloat16 (the rounds' dtype)"
    )
  if cell.rank <= 0:
    return (
      f'the persistent kernel runs low-rank rounds only (their weights split over the grid), '
      f'got rank {cell.rank}: set model.mogrifier.rank > 0'
    )
  return None


def persistent_mogrified_lstm_window(
  cell: Mogrify, params, carry, inputs, state_mask=None, unroll=1, steps=None
):
  """`Mogrify(LSTMCell)`'s window with the forward pass and the backward
  chain as persistent kernels; `unroll` does not apply
  (`persistent_mogrifier_refusal` says what it runs)."""
  from lm_zoo.cells.persistent_lstm import where_it_runs

  check_persistent_window(inputs, steps)
  lstm, inner = cell.cell, params['cell']
  rounds = {key: value for key, value in params.items() if key != 'cell'}
  mix = MogrifierRounds(cell.rounds, cell.zigzag, cell.dtype)
  weights = (inner['input']['kernel'], gate_bias(inner), inner['recurrent_kernel'])
  kernels = PersistentMogrifierKernels(**where_it_runs())
  return mixed_lstm_recurrence(
    inputs,
    *weights,
    carry,
    mix,
    rounds,
    state_mask,
    jnp.bfloat16,
    unroll,
    lstm.cap_input_gate,
    forward=kernels.forward,
    backward=kernels.backward,
  )
