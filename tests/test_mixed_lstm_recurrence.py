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
from mixed_lstms import MIXED_ARGS, mixed_fused, mixed_inputs, mixed_objective, mixed_reference

from lm_zoo.cells.lstm import lstm_update
from lm_zoo.cells.mixed_lstm_recurrence import (
  mixed_lstm_recurrence,
)
from lm_zoo.cells.mogrifier import MogrifierRounds
from lm_zoo.layers.products import aligned_contractions, einsum

# Every function of these tests is run through jax.jit: op by op, each of its
# operations (and the scan) would compile on its own.


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


@pytest.mark.parametrize('rounds', [1, 3], ids=['fewer rounds', 'more rounds'])
def test_round_parameters_that_are_not_the_rounds_it_runs_are_refused(rounds):
  """As scan='pallas' refuses them: a window of one round ignored the second
  round's parameters, silently, and one of three failed with a KeyError."""
  args = mixed_inputs(2, 0, dtype=jnp.float32)
  with pytest.raises(
    ValueError, match=rf"mix_params holds the rounds \['q1', 'r2'\], but mix runs {rounds}: give"
  ):
    mixed_lstm_recurrence(
      args['inputs'],
      args['input_kernel'],
      args['bias'],
      args['recurrent_kernel'],
      (args['c0'], args['h0']),
      MogrifierRounds(rounds),
      args['round_params'],
    )
