"""mixed_lstm_recurrence's passes alone (`mixed_lstm_forward`,
`mixed_lstm_backward_chain`: the references of kernels') and a forward pass
or backward chain of one's own in place of its scans (`forward=`,
`backward=`), with the Mogrifier's rounds as its mix."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixed_lstms import MIXED_ARGS, M, mixed_fused, mixed_inputs, mixed_objective, mixed_reference

from lm_zoo.cells.mixed_lstm_recurrence import (
  mixed_lstm_backward_chain,
  mixed_lstm_forward,
  mixed_lstm_recurrence,
)
from lm_zoo.cells.mogrifier import MogrifierRounds


def test_the_forward_pass_alone_keeps_what_the_equations_give():
  """`mixed_lstm_forward`: outputs and carry as the plain scan; the kept
  activations, cells and [x', h'] are the equations' at every step, and the
  residuals mix.forward's."""
  with jax.enable_x64():
    args = mixed_inputs(3, 2, seed=8)
    mix = MogrifierRounds(3)
    r = args['round_params']
    hs, (c, h), (acts, cs, mixed, residuals) = mixed_lstm_forward(
      args['inputs'],
      args['input_kernel'],
      args['bias'],
      args['recurrent_kernel'],
      (args['c0'], args['h0']),
      mix,
      r,
      args['mask'],
    )
    values = [args[name] for name in MIXED_ARGS]
    (c_ref, h_ref), hs_ref = mixed_reference(mix, *values)
    for got, want in ((hs, hs_ref), (c, c_ref), (h, h_ref)):
      np.testing.assert_allclose(got, want, rtol=1e-12)
    h_prev = jnp.concatenate([args['h0'][None], hs[:-1]])
    for t in range(hs.shape[0]):
      x_up, h_up, kept = mix.forward(r, args['inputs'][t], h_prev[t] * args['mask'])
      np.testing.assert_allclose(mixed[t], jnp.concatenate([x_up, h_up], -1), rtol=1e-12)
      np.testing.assert_allclose(residuals[t], kept, rtol=1e-12)
      gates = x_up @ args['input_kernel'] + h_up @ args['recurrent_kernel'] + args['bias']
      i, f, j, o = jnp.split(gates, 4, axis=-1)
      sigmoid = jax.nn.sigmoid
      np.testing.assert_allclose(
        acts[t], jnp.concatenate([sigmoid(i), sigmoid(f), jnp.tanh(j), sigmoid(o)], -1), rtol=1e-12
      )
      c_prev = args['c0'] if t == 0 else cs[t - 1]
      np.testing.assert_allclose(cs[t], sigmoid(f) * c_prev + sigmoid(i) * jnp.tanh(j), rtol=1e-12)


class _ShiftedForward:
  """A `ForwardPass`: `mixed_lstm_forward` with `shift` added to its outputs."""

  def __init__(self, shift):
    self.shift = shift

  def __call__(self, mix, mix_params, weights, inputs, carry, state_mask, cap_input_gate):
    hs, new_carry, per_step = mixed_lstm_forward(
      inputs, *weights, carry, mix, mix_params, state_mask, cap_input_gate=cap_input_gate
    )
    return hs + self.shift, new_carry, per_step


def test_a_forward_pass_of_its_own_runs_with_the_hand_written_backward():
  """The window's outputs are the given forward pass's; its gradients the
  scan's (the same residuals, the same backward pass); no held steps."""
  with jax.enable_x64():
    args = mixed_inputs(2, 2, seed=9)
    values = [args[name] for name in MIXED_ARGS]
    mix = MogrifierRounds(2)

    window = lambda forward: partial(mixed_fused, forward=forward)
    _, hs = window(_ShiftedForward(0.0))(mix, *values)
    _, shifted = window(_ShiftedForward(1.0))(mix, *values)
    np.testing.assert_allclose(shifted, hs + 1.0, rtol=1e-12)
    grads = [
      jax.grad(mixed_objective(window(forward), mix), argnums=range(len(MIXED_ARGS)))(*values)
      for forward in (None, _ShiftedForward(0.0))
    ]
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-12), *grads)
    with pytest.raises(ValueError, match='no held steps: pass steps=None'):
      mixed_lstm_recurrence(
        *values[1:2],
        *values[2:5],
        (args['c0'], args['h0']),
        mix,
        args['round_params'],
        steps=jnp.ones(6, bool),
        forward=_ShiftedForward(0.0),
      )


def test_the_backward_chain_alone_gives_autodiffs_gradients():
  """`mixed_lstm_backward_chain` from `mixed_lstm_forward`'s residuals:
  dL/dc_0, dL/dh_0, the mask's and the inputs' gradients as autodiff of the
  plain scan gives them; the gate gradients summed over steps and rows are
  dL/db, and each round's stash of d z_i summed is dL/d its bias."""
  with jax.enable_x64():
    args = mixed_inputs(3, 2, seed=10)
    mix, r = MogrifierRounds(3), args['round_params']
    values = [args[name] for name in MIXED_ARGS]
    d_hs = jax.random.normal(jax.random.key(11), args['inputs'].shape[:2] + (4,), jnp.float64)
    d_last = (jnp.full((3, 4), 0.2), jnp.full((3, 4), -0.3))

    def loss(*values):
      (c, h), hs = mixed_reference(mix, *values)
      return jnp.sum(hs * d_hs) + jnp.sum(c * d_last[0]) + jnp.sum(h * d_last[1])

    want = dict(zip(MIXED_ARGS, jax.grad(loss, argnums=range(len(MIXED_ARGS)))(*values)))
    carry, weights = (args['c0'], args['h0']), (args['input_kernel'], args['recurrent_kernel'])
    hs, _, per_step = mixed_lstm_forward(
      args['inputs'], weights[0], args['bias'], weights[1], carry, mix, r, args['mask']
    )
    (d_c0, d_h0, d_mask), (d_gates, d_inputs, stashes) = mixed_lstm_backward_chain(
      (d_hs, d_last), args['inputs'], *weights, carry, mix, r, args['mask'], hs, per_step
    )
    close = partial(np.testing.assert_allclose, rtol=1e-10, atol=1e-12)
    close(d_c0, want['c0'])
    close(d_h0, want['h0'])
    close(d_mask, want['mask'])
    close(d_inputs, want['inputs'])
    close(jnp.sum(d_gates, axis=(0, 1)), want['bias'])
    widths = [M, 4, M]  # the rounds' gate widths: x, h, x
    starts = np.cumsum([0] + widths)
    for i, name in enumerate(['q1', 'r2', 'q3']):
      close(
        jnp.sum(stashes[..., starts[i] : starts[i + 1]], axis=(0, 1)),
        want['round_params'][name]['bias'],
      )


class _ShiftedBackward:
  """A `BackwardChain`: `mixed_lstm_backward_chain` with `shift` added to dL/dx."""

  def __init__(self, shift):
    self.shift = shift

  def __call__(self, mix, mix_params, weights, inputs, carry, state_mask, hs, per_step, d, cap):
    (input_kernel, _, recurrent_kernel) = weights
    firsts, (d_gates, d_inputs, stashes) = mixed_lstm_backward_chain(
      d, inputs, input_kernel, recurrent_kernel, carry, mix, mix_params, state_mask, hs, per_step
    )
    return firsts, (d_gates, d_inputs + self.shift, stashes)


def test_a_backward_chain_of_its_own_gives_the_window_its_gradients():
  """Every gradient comes from the given chain: with dL/dx shifted, the
  inputs' gradient is shifted and every other one is the scan's."""
  with jax.enable_x64():
    args = mixed_inputs(2, 2, seed=12)
    values = [args[name] for name in MIXED_ARGS]
    mix = MogrifierRounds(2)

    window = lambda backward: partial(mixed_fused, backward=backward)
    grads = [
      jax.grad(mixed_objective(window(backward), mix), argnums=range(len(MIXED_ARGS)))(*values)
      for backward in (None, _ShiftedBackward(0.5))
    ]
    for name, scan, own in zip(MIXED_ARGS, *grads):
      shift = 0.5 if name == 'inputs' else 0.0
      jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a + shift, rtol=1e-12), scan, own)


def test_both_passes_alone_refuse_round_parameters_that_are_not_their_rounds():
  """As `mixed_lstm_recurrence` does: the passes alone, the references the
  persistent kernels are tested against, ignored a surplus round's
  parameters silently."""
  args = mixed_inputs(2, 0, dtype=jnp.float32)
  carry, weights = (args['c0'], args['h0']), (args['input_kernel'], args['recurrent_kernel'])
  refused = r"mix_params holds the rounds \['q1', 'r2'\], but mix runs 1: give \['q1'\]"
  with pytest.raises(ValueError, match=refused):
    mixed_lstm_forward(
      args['inputs'],
      weights[0],
      args['bias'],
      weights[1],
      carry,
      MogrifierRounds(1),
      args['round_params'],
    )
  mix = MogrifierRounds(2)
  hs, _, per_step = mixed_lstm_forward(
    args['inputs'], weights[0], args['bias'], weights[1], carry, mix, args['round_params']
  )
  cotangents = (jnp.ones_like(hs), (jnp.zeros_like(carry[0]), jnp.zeros_like(carry[1])))
  with pytest.raises(ValueError, match=refused):
    mixed_lstm_backward_chain(
      cotangents,
      args['inputs'],
      *weights,
      carry,
      MogrifierRounds(1),
      args['round_params'],
      None,
      hs,
      per_step,
    )
