"""The Mogrifier rounds' Pallas kernels (interpreted on the CPU) against
`MogrifierRounds`, the mix the fused window differentiates by hand, forward
and backward; and lowered for NVIDIA GPUs at the 24M recipe's padded sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import lower_for_cuda

from lm_zoo.cells import LSTMCell, Mogrify
from lm_zoo.cells.mogrifier import MogrifierRounds, round_name
from lm_zoo.kernels.lstm_step import Tiles, row_tiles, tiles_for
from lm_zoo.kernels.mogrifier_rounds import rounds_backward, rounds_forward

B, M, N, RANK = 16, 32, 48, 16
TILES = Tiles(batch=16, units=16, chunk=16)


def _rounds(rounds, rank, zigzag, seed=0, batch=B):
  cell = Mogrify(LSTMCell(N), rounds=rounds, rank=rank, zigzag=zigzag)
  keys = jax.random.split(jax.random.key(seed), 4)
  x = jax.random.normal(keys[0], (batch, M))
  h = jnp.tanh(jax.random.normal(keys[1], (batch, N)))
  params = cell.init(keys[2], cell.initialize_carry(keys[2], (batch, M)), x)['params']
  rounds_params = {
    name: jax.tree.map(  # nonzero biases, gates away from 1
      lambda a: a + 0.2 * jax.random.normal(keys[3], a.shape), p
    )
    for name, p in params.items()
    if name != 'cell'
  }
  return x, h, rounds_params, [rounds_params[round_name(i)] for i in range(1, rounds + 1)]


CASES = [(5, RANK, True), (4, RANK, False), (3, 0, True), (2, 0, False), (1, RANK, True)]


@pytest.mark.parametrize('rounds, rank, zigzag', CASES)
def test_forward_and_backward_are_mogrifier_rounds(rounds, rank, zigzag):
  x, h, params, ordered = _rounds(rounds, rank, zigzag)
  mix = MogrifierRounds(rounds, zigzag)
  want_x, want_h, want_residuals = mix.forward(params, x, h)
  mixed, gates, hiddens = rounds_forward(
    x, h, ordered, zigzag=zigzag, tiles=TILES, dtype=jnp.float32
  )
  np.testing.assert_allclose(mixed, jnp.concatenate([want_x, want_h], -1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    jnp.concatenate(gates + hiddens, -1), want_residuals, rtol=1e-5, atol=1e-5
  )
  d_x, d_h = (
    jax.random.normal(jax.random.key(9), (B, M)),
    jax.random.normal(jax.random.key(8), (B, N)),
  )
  want_dx, want_dh, want_stash = mix.backward(params, x, h, want_residuals, d_x, d_h)
  got_dx, got_dh, d_z, d_hidden = rounds_backward(
    jnp.concatenate([d_x, d_h], -1),
    x,
    h,
    gates,
    ordered,
    zigzag=zigzag,
    tiles=TILES,
    dtype=jnp.float32,
  )
  np.testing.assert_allclose(got_dx, want_dx, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_dh, want_dh, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jnp.concatenate(d_z + d_hidden, -1), want_stash, rtol=1e-5, atol=1e-5)


def test_programs_of_16_rows_each_give_their_own_rows():
  """48 rows as 3 programs (the windows' `row_tiles`): each writes its own
  rows, forward and backward, as `MogrifierRounds` computes them."""
  x, h, params, ordered = _rounds(3, RANK, True, seed=2, batch=48)
  tiles = row_tiles(Tiles(batch=64, units=16, chunk=16))
  assert tiles == Tiles(batch=16, units=16, chunk=16)
  mix = MogrifierRounds(3, True)
  want_x, want_h, want_residuals = mix.forward(params, x, h)
  mixed, gates, _ = rounds_forward(x, h, ordered, zigzag=True, tiles=tiles, dtype=jnp.float32)
  np.testing.assert_allclose(mixed, jnp.concatenate([want_x, want_h], -1), rtol=1e-5, atol=1e-5)
  d_mixed = jax.random.normal(jax.random.key(7), (48, M + N))
  want_dx, want_dh, _ = mix.backward(params, x, h, want_residuals, d_mixed[:, :M], d_mixed[:, M:])
  got_dx, got_dh, _, _ = rounds_backward(
    d_mixed, x, h, gates, ordered, zigzag=True, tiles=tiles, dtype=jnp.float32
  )
  np.testing.assert_allclose(got_dx, want_dx, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_dh, want_dh, rtol=1e-5, atol=1e-5)


def test_the_rounds_match_the_papers_equations_in_numpy():
  """Independently of `MogrifierRounds`: x^i = 2σ(h^{i-1} Q) ⊙ x^{i-2} and
  h^i = 2σ(x^{i-1} R) ⊙ h^{i-2}, zigzag, low rank, written again in NumPy."""
  x, h, _, ordered = _rounds(3, RANK, True, seed=1)
  xs, hs = np.asarray(x, np.float64), np.asarray(h, np.float64)
  for i, p in enumerate(ordered, start=1):
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    gate = 2 / (1 + np.exp(-((hs if i % 2 else xs) @ p['kernel_in'] @ p['kernel_out'] + p['bias'])))
    xs, hs = (gate * xs, hs) if i % 2 else (xs, gate * hs)
  mixed, _, _ = rounds_forward(x, h, ordered, zigzag=True, tiles=TILES, dtype=jnp.float32)
  np.testing.assert_allclose(mixed, np.concatenate([xs, hs], -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('rank', [128, 0], ids=['rank 84 padded', 'full rank'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16], ids=['float32', 'bfloat16'])
def test_both_kernels_lower_for_nvidia_gpus(rank, dtype):
  """The 24M Mogrifier (912 units padded to 960, 5 rounds) at batch 64, in
  programs of the rows its window gives them."""
  batch, width = 64, 960
  tiles = row_tiles(tiles_for(batch, width))
  spec = jax.ShapeDtypeStruct
  if rank:
    params = [
      {
        'kernel_in': spec((width, rank), dtype),
        'kernel_out': spec((rank, width), dtype),
        'bias': spec((width,), jnp.float32),
      }
      for _ in range(5)
    ]
  else:
    params = [
      {'kernel': spec((width, width), dtype), 'bias': spec((width,), jnp.float32)} for _ in range(5)
    ]
  rows = spec((batch, width), jnp.float32)
  forward = jax.jit(
    lambda x, h, p: rounds_forward(x, h, p, zigzag=True, tiles=tiles, dtype=dtype, interpret=False)
  )
  backward = jax.jit(
    lambda d, x, h, g, p: rounds_backward(
      d, x, h, g, p, zigzag=True, tiles=tiles, dtype=dtype, interpret=False
    )
  )
  for lowered in (
    lower_for_cuda(forward, rows, rows, params),
    lower_for_cuda(backward, spec((batch, 2 * width), jnp.float32), rows, rows, [rows] * 5, params),
  ):
    assert '__gpu$xla.gpu.triton' in lowered.as_text()


def test_an_interpret_that_is_not_a_bool_or_none_is_refused():
  """Pallas takes any truthy value as True: interpret='no' ran interpreted."""
  x, h, _, ordered = _rounds(2, RANK, True)
  refused = r"interpret must be True \(Pallas' interpreter\), False .* or None .*, got 'no'"
  with pytest.raises(ValueError, match=refused):
    rounds_forward(x, h, ordered, zigzag=True, tiles=TILES, dtype=jnp.float32, interpret='no')
  d_mixed = jnp.zeros((B, M + N))
  with pytest.raises(ValueError, match=refused):
    rounds_backward(
      d_mixed, x, h, [], ordered, zigzag=True, tiles=TILES, dtype=jnp.float32, interpret='no'
    )
