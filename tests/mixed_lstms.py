"""What the tests of `mixed_lstm_recurrence` share (test_mixed_lstm_recurrence.py,
test_mixed_lstm_passes.py): the Mogrifier window's inputs, its equations as a
plain scan differentiated by autodiff, the fused window, and an objective."""

import jax
import jax.numpy as jnp

from lm_zoo.cells.lstm import lstm_update
from lm_zoo.cells.mixed_lstm_recurrence import mixed_lstm_recurrence

M = 5  # input size (n = 4 units by default)


def mixed_inputs(rounds, rank, seed=0, dtype=jnp.float64, batch=3, n=4, steps=6, m=M):
  keys = iter(jax.random.split(jax.random.key(seed), 7 + 3 * rounds))
  normal = lambda shape, scale=1.0: scale * jax.random.normal(next(keys), shape, dtype)
  round_params = {}
  for i in range(1, rounds + 1):
    m_in, m_out = (n, m) if i % 2 else (m, n)
    kernels = (
      {'kernel_in': normal((m_in, rank), 0.7), 'kernel_out': normal((rank, m_out), 0.7)}
      if rank
      else {'kernel': normal((m_in, m_out), 0.5)}
    )
    round_params[f'q{i}' if i % 2 else f'r{i}'] = {**kernels, 'bias': normal((m_out,), 0.3)}
  return dict(
    inputs=normal((steps, batch, m)),
    input_kernel=normal((m, 4 * n), 0.5),
    bias=normal((4 * n,), 0.3),
    recurrent_kernel=normal((n, 4 * n), 0.5),
    c0=normal((batch, n)),
    h0=jnp.tanh(normal((batch, n))),
    mask=jax.random.bernoulli(next(keys), 0.7, (batch, n)).astype(dtype) / 0.7,
    round_params=round_params,
  )


def mixed_reference(
  mix, round_params, inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask, cap=False
):
  """The mixed LSTM as a plain scan of its equations, differentiated by autodiff."""

  def step(carry, x):
    c, h = carry
    x_up, h_up, _ = mix.forward(round_params, x, h * mask)
    new_c, new_h = lstm_update(x_up @ input_kernel + h_up @ recurrent_kernel + bias, c, cap)
    return (new_c, new_h), new_h

  return jax.lax.scan(step, (c0, h0), inputs)


def mixed_fused(
  mix,
  round_params,
  inputs,
  input_kernel,
  bias,
  recurrent_kernel,
  c0,
  h0,
  mask,
  unroll=1,
  cap=False,
  **passes,
):
  """`mixed_lstm_recurrence` of these arguments; `passes`: its `forward=`, `backward=`."""
  return mixed_lstm_recurrence(
    inputs,
    input_kernel,
    bias,
    recurrent_kernel,
    (c0, h0),
    mix,
    round_params,
    mask,
    unroll=unroll,
    cap_input_gate=cap,
    **passes,
  )


MIXED_ARGS = [
  'round_params',
  'inputs',
  'input_kernel',
  'bias',
  'recurrent_kernel',
  'c0',
  'h0',
  'mask',
]


def mixed_objective(recurrence, mix):
  def loss(*args):
    (c, h), hs = recurrence(mix, *args)
    weights = jnp.arange(1, hs.size + 1, dtype=hs.dtype).reshape(hs.shape) / hs.size
    return jnp.sum(jnp.sin(hs) * weights) + jnp.sum(c**2) + jnp.sum(h * 0.3)

  return loss
