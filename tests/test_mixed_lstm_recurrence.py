"""mixed_lstm_recurrence, with the Mogrifier's rounds as its mix (the one the
zoo uses; `MogrifierRounds` itself is tested in test_mogrifier.py): its
custom VJP against autodiff of the plain scan of its equations, with and
without the capped input gate."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxprs import summed_sizes_in_loops

from lm_zoo.cells.lstm import lstm_update
from lm_zoo.cells.mixed_lstm_recurrence import (
  mixed_lstm_backward_chain,
  mixed_lstm_forward,
  mixed_lstm_recurrence,
)
from lm_zoo.cells.mogrifier import MogrifierRounds
from lm_zoo.layers.products import aligned_contractions, einsum

# Every function of these tests is run through jax.jit: op by op, each of its
# operations (and the scan) would compile on its own.

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
  mix, round_params, inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask, unroll=1, cap=False
):
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


@pytest.mark.parametrize(
  'rounds, rank, zigzag, unroll, cap',
  [
    (1, 0, True, 1, False),
    (5, 3, True, 2, False),
    (5, 0, False, 1, True),
    (4, 2, False, 3, False),
    (5, 3, True, 1, True),
  ],
)
def test_mixed_recurrence_equals_the_plain_scan_with_every_gradient(
  rounds, rank, zigzag, unroll, cap
):
  with jax.enable_x64():
    args = mixed_inputs(rounds, rank, seed=rounds)
    values = [args[name] for name in MIXED_ARGS]
    mix = MogrifierRounds(rounds, zigzag)
    (c, h), hs = jax.jit(partial(mixed_fused, mix, unroll=unroll, cap=cap))(*values)
    (c_ref, h_ref), hs_ref = jax.jit(partial(mixed_reference, mix, cap=cap))(*values)
    for got, want in ((hs, hs_ref), (c, c_ref), (h, h_ref)):
      np.testing.assert_allclose(got, want, rtol=1e-12)
    grads = jax.jit(
      jax.grad(
        mixed_objective(lambda *a: mixed_fused(*a, unroll=unroll, cap=cap), mix),
        argnums=range(len(MIXED_ARGS)),
      )
    )(*values)
    expected = jax.jit(
      jax.grad(
        mixed_objective(lambda *a: mixed_reference(*a, cap=cap), mix),
        argnums=range(len(MIXED_ARGS)),
      )
    )(*values)
    for name, got, want in zip(MIXED_ARGS, grads, expected):
      jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name),
        got,
        want,
      )


@pytest.mark.parametrize('cap', [False, True])
def test_mixed_bfloat16_products_match_autodiff_of_the_same_rounded_products(cap):
  """The Mogrifier window in bfloat16 (rounds and gates), with and without
  the capped gate: its hand-written backward pass matches autodiff of a plain
  scan rounding the same operands (the rounds' own products in bfloat16, the
  gates' through `products.einsum`) far closer than either comes to float32."""
  args = mixed_inputs(5, 3, seed=3, dtype=jnp.float32, batch=5, n=8, steps=10)
  values = [args[name] for name in MIXED_ARGS]
  mix = MogrifierRounds(5, dtype=jnp.bfloat16)

  def rounded_reference(
    mix, round_params, inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask
  ):
    def step(carry, x):
      c, h = carry
      x_up, h_up, _ = mix.forward(round_params, x, h * mask)
      gates = (
        einsum('bm,mk->bk', x_up, input_kernel, jnp.bfloat16)
        + einsum('bn,nk->bk', h_up, recurrent_kernel, jnp.bfloat16)
        + bias
      )
      new_c, new_h = lstm_update(gates, c, cap)
      return (new_c, new_h), new_h

    return jax.lax.scan(step, (c0, h0), inputs)

  fused_bf16 = lambda mix, *a: mixed_lstm_recurrence(
    a[1], a[2], a[3], a[4], (a[5], a[6]), mix, a[0], a[7], dtype=jnp.bfloat16, cap_input_gate=cap
  )
  (c, h), hs = jax.eval_shape(partial(fused_bf16, mix), *values)
  assert hs.dtype == c.dtype == h.dtype == jnp.float32
  argnums = range(len(MIXED_ARGS))
  got = jax.jit(jax.grad(mixed_objective(fused_bf16, mix), argnums=argnums))(*values)
  want = jax.jit(jax.grad(mixed_objective(rounded_reference, mix), argnums=argnums))(*values)
  full = jax.jit(
    jax.grad(
      mixed_objective(lambda m, *a: mixed_reference(m, *a, cap=cap), MogrifierRounds(5)),
      argnums=argnums,
    )
  )(*values)
  # Relative distances per leaf. The two passes round the same operands, but
  # sums taken in another float32 order can tip one bfloat16 rounding the
  # other way, and the window carries the tip on: with this seed one tips
  # without the cap (6e-3 at most; with the cap 2e-7, and seeds 4 to 6 give
  # at most 6e-7 either way), while both passes lie 0.4% to 3% from
  # float32. A wrong factor would be off by its whole size.
  distance = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
  for name, g, w, f in zip(MIXED_ARGS, got, want, full):
    for g_leaf, w_leaf, f_leaf in zip(*map(jax.tree.leaves, (g, w, f))):
      assert g_leaf.dtype == jnp.float32, name
      # Bounds with room for other tips on other machines (6.2e-3 and 0.41
      # at most here, c0's).
      assert distance(g_leaf, w_leaf) < 2e-2, name
      assert distance(g_leaf, w_leaf) < 0.75 * distance(g_leaf, f_leaf), name
      assert 1e-3 < distance(g_leaf, f_leaf) < 0.1, name  # bfloat16 did round


def test_mixed_recurrence_with_aligned_weights_gives_the_plain_scan():
  """[W; U] padded to 128 rows and Uᵀ's 252 gate rows to 256 before the
  loops (64 inputs, 63 units): the gates' products sum over multiples of 64,
  and values and gradients are the plain scan's."""
  with jax.enable_x64():
    args = mixed_inputs(2, 3, seed=2, batch=2, n=63, steps=3, m=64)
    values = [args[name] for name in MIXED_ARGS]
    mix = MogrifierRounds(2, True)
    gradient = jax.grad(mixed_objective(mixed_fused, mix), argnums=range(len(MIXED_ARGS)))
    with aligned_contractions(64):
      sizes = set(summed_sizes_in_loops(jax.make_jaxpr(gradient)(*values).jaxpr))
      (c, h), hs = jax.jit(partial(mixed_fused, mix))(*values)
      grads = jax.jit(gradient)(*values)
    assert {128, 256} <= sizes and not {64 + 63, 4 * 63} & sizes  # (the rounds sum over 63, 64, 3)
    (c_ref, h_ref), hs_ref = jax.jit(partial(mixed_reference, mix))(*values)
    for got, want in ((hs, hs_ref), (c, c_ref), (h, h_ref)):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    expected = jax.jit(
      jax.grad(mixed_objective(mixed_reference, mix), argnums=range(len(MIXED_ARGS)))
    )(*values)
    for name, got, want in zip(MIXED_ARGS, grads, expected):
      jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name),
        got,
        want,
      )


def test_mixed_recurrence_matches_finite_differences_of_a_round_kernel():
  with jax.enable_x64():
    args = mixed_inputs(3, 2, seed=7)
    mix = MogrifierRounds(3)
    values = [args[name] for name in MIXED_ARGS]
    loss = jax.jit(mixed_objective(mixed_fused, mix))
    grad = jax.jit(jax.grad(loss))(*values)['r2']['kernel_in']
    direction = np.asarray(jax.random.normal(jax.random.key(9), grad.shape, grad.dtype))

    def along(eps):
      shifted = jax.tree.map(lambda x: x, values[0])
      shifted['r2'] = {
        **shifted['r2'],
        'kernel_in': np.asarray(shifted['r2']['kernel_in']) + eps * direction,
      }
      return loss(shifted, *values[1:])

    eps = 1e-6
    np.testing.assert_allclose(
      np.vdot(grad, direction), (along(eps) - along(-eps)) / (2 * eps), rtol=1e-7
    )


def test_mixed_recurrence_names_mismatched_shapes():
  args = mixed_inputs(1, 0, dtype=jnp.float32)
  with pytest.raises(ValueError, match='do not fit an LSTM of 4 units'):
    mixed_lstm_recurrence(
      args['inputs'],
      args['input_kernel'][:-1],
      args['bias'],
      args['recurrent_kernel'],
      (args['c0'], args['h0']),
      MogrifierRounds(1),
      args['round_params'],
    )


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

    def window(forward):
      def run(mix, round_params, inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask):
        weights = (input_kernel, bias, recurrent_kernel)
        return mixed_lstm_recurrence(
          inputs, *weights, (c0, h0), mix, round_params, mask, forward=forward
        )

      return run

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

    def window(backward):
      def run(mix, round_params, inputs, input_kernel, bias, recurrent_kernel, c0, h0, mask):
        weights = (input_kernel, bias, recurrent_kernel)
        return mixed_lstm_recurrence(
          inputs, *weights, (c0, h0), mix, round_params, mask, backward=backward
        )

      return run

    grads = [
      jax.grad(mixed_objective(window(backward), mix), argnums=range(len(MIXED_ARGS)))(*values)
      for backward in (None, _ShiftedBackward(0.5))
    ]
    for name, scan, own in zip(MIXED_ARGS, *grads):
      shift = 0.5 if name == 'inputs' else 0.0
      jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a + shift, rtol=1e-12), scan, own)
