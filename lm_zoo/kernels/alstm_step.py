"""One aLSTM time step (`lm_zoo.cells.adapted_step`) as one Pallas kernel,
forward and backward.

Forward, for rows x = x_t, h = m ⊙ h_{t-1} and the latent's x-part
P_z = x W_zx + b_z computed for the whole window before the scan:

    z = LSTM(P_z + h W_zh, z_{t-1})  or  z = ReLU(P_z + h W_zh)
    π = tanh(z P) = [π_x | π_h | π_W | π_V | π_b]
    a = (π_x ⊙ x) W,  r = (π_h ⊙ h) V,  G = π_W ⊙ a + π_V ⊙ r + π_b ⊙ b
    c_t, h_t from G as the LSTM's (σ(i) capped at 1 - σ(f) with the cap)

The recurrent product is scaled per gate after it is summed, and π_x, π_h
need all of z, and z all of h: every stage needs whole rows of the one
before. Without a barrier across programs, one launch a step means that a
program owns whole rows: the grid covers batch tiles, and each program runs
the latent, the policy and the gates over its rows, chunk by chunk along
the widths, meeting its threads at a barrier between stages (as
`mogrifier_rounds` does). It keeps what the backward pass reads: the gate
activations, c_t, π, a, r, z and the latent's activations and cell state.

Backward, from dL/dh_t (the output's plus the step after's, which it masks)
and dL/dc_t: the gates' gradients g from the factors the caller computed
for every step at once, then

    d(π_x ⊙ x) = (g ⊙ π_W) Wᵀ,  d(π_h ⊙ h) = (g ⊙ π_V) Vᵀ,
    q = [d(π_x ⊙ x) ⊙ x | d(π_h ⊙ h) ⊙ h | g ⊙ a | g ⊙ r | g ⊙ b] ⊙ (1 - π²),
    dz = q Pᵀ (+ dz from the step after), back through the latent to its
    gates' gradient g_z, and dL/dh = d(π_h ⊙ h) ⊙ π_h + g_z W_zhᵀ,

the same stages in reverse, whole rows again. It returns g, q, g_z and the
x-part d(π_x ⊙ x) ⊙ π_x, from which the caller forms every weight gradient
(and x's gradient through W_zx) over the whole window at once.

Layouts are flat and gate-blocked, each block padded to the chunk: gates
(B, 4N) as [i | f | j | o], the latent's gates (B, 4K) likewise (a static
latent's (B, K)), π (B, M + 13N) as above with W's, V's and b's scales
gate-blocked; W (M, 4N), V (N, 4N), P (K, M + 13N), W_zh (N, 4K or K),
U_z (K, 4K). B a multiple of the tiles' batch, M, N and K of the chunk.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import jax
import jax.numpy as jnp

from lm_zoo.kernels.common import (
  RowProgram,
  call_by_rows,
  gate_update,
  resolve_interpret,
)
from lm_zoo.kernels.common import (
  shifted_columns as at,
)
from lm_zoo.kernels.lstm_step import GATES, Tiles


def policy_offsets(m: int, n: int) -> tuple[int, int, int, int, int]:
  """Where π_x, π_h, π_W, π_V and π_b start in π of padded widths m, n."""
  return 0, m, m + n, m + 5 * n, m + 9 * n


# The forward kernel's refs, in pallas_call's order (inputs, then outputs).
_FORWARD_REFS = {
  True: """x h mask c latent_in c_z z_prev latent_h latent_u policy kernel recurrent_kernel
    bias c_out h_out act_out pi a_out r_out z_out act_z_out c_z_out""".split(),
  False: """x h mask c latent_in latent_h policy kernel recurrent_kernel bias c_out h_out
    act_out pi a_out r_out z_out""".split(),
}


def _forward_kernel(*refs, widths, recurrent, cap_input_gate, body):
  m, n, k = widths
  io = types.SimpleNamespace(**dict(zip(_FORWARD_REFS[recurrent], refs, strict=True)))
  _latent(io, body, n, k, recurrent)
  body.barrier()  # π reads the whole of z
  _policy(io, body, m, n, k)
  body.barrier()  # the gates read the whole of π_x and π_h
  _adapted_gates(io, body, m, n, cap_input_gate)


def _masked_h(io, cols):
  """h = m ⊙ h_{t-1} at `cols`."""
  return io.h[:, cols] * io.mask[:, cols]


def _latent(io, body, n, k, recurrent):
  """z, the LSTM latent's activations and cell state, or the ReLU latent."""
  shape = (body.rows, body.chunk)

  def pre(cols, g):
    gc = at(cols, g * k)
    total = io.latent_in[:, gc] + body.summed(
      n, shape, lambda r: body.product(_masked_h(io, r), io.latent_h[r, gc])
    )
    if recurrent:
      total = total + body.summed(
        k, shape, lambda r: body.product(io.z_prev[:, r], io.latent_u[r, gc])
      )
    return total

  def latent(cols):
    if not recurrent:
      io.z_out[:, cols] = jax.nn.relu(pre(cols, 0))
      return
    acts, c_new, z = gate_update([pre(cols, g) for g in range(GATES)], io.c_z[:, cols], False)
    for g, act in enumerate(acts):
      io.act_z_out[:, at(cols, g * k)] = act
    io.c_z_out[:, cols] = c_new
    io.z_out[:, cols] = z

  body.each_chunk(k, latent)


def _policy(io, body, m, n, k):
  """π = tanh(z P)."""

  def policy(cols):
    z_p = body.summed(
      k, (body.rows, body.chunk), lambda r: body.product(io.z_out[:, r], io.policy[r, cols])
    )
    io.pi[:, cols] = jnp.tanh(z_p)

  body.each_chunk(m + 13 * n, policy)


def _adapted_gates(io, body, m, n, cap_input_gate):
  """a, r, the adapted gates G and the LSTM update from them."""
  shape = (body.rows, body.chunk)
  _, at_h, at_w, at_v, at_b = policy_offsets(m, n)

  def gates(cols):
    pre = []
    for g in range(GATES):
      gc = at(cols, g * n)
      a = body.summed(
        m, shape, lambda r, gc=gc: body.product(io.pi[:, r] * io.x[:, r], io.kernel[r, gc])
      )
      r = body.summed(
        n,
        shape,
        lambda s, gc=gc: body.product(
          io.pi[:, at(s, at_h)] * _masked_h(io, s), io.recurrent_kernel[s, gc]
        ),
      )
      io.a_out[:, gc], io.r_out[:, gc] = a, r
      pre.append(
        io.pi[:, at(gc, at_w)] * a
        + (io.pi[:, at(gc, at_v)] * r + io.pi[:, at(gc, at_b)] * io.bias[gc][None, :])
      )
    acts, c_new, h_new = gate_update(pre, io.c[:, cols], cap_input_gate)
    for g, act in enumerate(acts):
      io.act_out[:, at(cols, g * n)] = act
    io.c_out[:, cols], io.h_out[:, cols] = c_new, h_new

  body.each_chunk(n, gates)


# The backward kernel's refs, in pallas_call's order (inputs, then outputs).
_BACKWARD_REFS = {
  True: """d_out d_rec mask d_c d_c_from_h scales forget x h pi a r d_c_z d_z_next
    d_c_z_from_z scales_z forget_z kernel recurrent_kernel bias policy latent_h latent_u
    d_c_out d_h_out d_gates q d_x_out d_latent d_c_z_out d_z_out""".split(),
  False: """d_out d_rec mask d_c d_c_from_h scales forget x h pi a r z kernel
    recurrent_kernel bias policy latent_h d_c_out d_h_out d_gates q d_x_out d_latent""".split(),
}


def _backward_kernel(*refs, widths, recurrent, body):
  m, n, k = widths
  io = types.SimpleNamespace(**dict(zip(_BACKWARD_REFS[recurrent], refs, strict=True)))
  _gate_gradients(io, body, n)
  body.barrier()  # the sums below read every gate's gradient
  _policy_gradients(io, body, m, n)
  body.barrier()  # dz sums the whole of q
  _latent_gradients(io, body, m, n, k, recurrent)
  body.barrier()  # the latent's inputs' gradients sum every latent gate's
  _latent_input_gradients(io, body, n, k, recurrent)


def _gate_gradients(io, body, n):
  """The gates' gradients g and dL/dc_{t-1}."""

  def gates(cols):
    d_h = io.d_out[:, cols] + io.d_rec[:, cols] * io.mask[:, cols]
    d_c_t = io.d_c[:, cols] + d_h * io.d_c_from_h[:, cols]
    for g in range(GATES):
      gc = at(cols, g * n)
      io.d_gates[:, gc] = io.scales[:, gc] * (d_h if g == GATES - 1 else d_c_t)
    io.d_c_out[:, cols] = d_c_t * io.forget[:, cols]

  body.each_chunk(n, gates)


def _policy_gradients(io, body, m, n):
  """q, the gradient of π's pre-activation, and the x- and h-parts that go
  on through x and h."""
  shape = (body.rows, body.chunk)
  _, at_h, at_w, at_v, at_b = policy_offsets(m, n)

  def scaled_input(offset, matrix):
    """d(π ⊙ input) at `cols` through W (offset of π_W) or V (of π_V)."""
    return lambda cols: body.summed(
      GATES * n,
      shape,
      lambda s: body.product(
        io.d_gates[:, s] * io.pi[:, at(s, offset)], matrix[cols, s], transpose_b=True
      ),
    )

  def x_part(cols):
    d_scaled, pi_x = scaled_input(at_w, io.kernel)(cols), io.pi[:, cols]
    io.q[:, cols] = d_scaled * io.x[:, cols] * (1 - pi_x * pi_x)
    io.d_x_out[:, cols] = d_scaled * pi_x

  def h_part(cols):
    d_scaled, pi_h = scaled_input(at_v, io.recurrent_kernel)(cols), io.pi[:, at(cols, at_h)]
    io.q[:, at(cols, at_h)] = d_scaled * io.h[:, cols] * io.mask[:, cols] * (1 - pi_h * pi_h)
    io.d_h_out[:, cols] = d_scaled * pi_h

  def gate_parts(cols):
    d_g = io.d_gates[:, cols]
    for offset, value in (
      (at_w, io.a[:, cols]),
      (at_v, io.r[:, cols]),
      (at_b, io.bias[cols][None, :]),
    ):
      pi_g = io.pi[:, at(cols, offset)]
      io.q[:, at(cols, offset)] = d_g * value * (1 - pi_g * pi_g)

  body.each_chunk(m, x_part)
  body.each_chunk(n, h_part)
  body.each_chunk(GATES * n, gate_parts)


def _latent_gradients(io, body, m, n, k, recurrent):
  """dz = q Pᵀ (plus the step after's), back to the latent's gates."""
  shape = (body.rows, body.chunk)

  def latent(cols):
    d_z = body.summed(
      m + 13 * n, shape, lambda s: body.product(io.q[:, s], io.policy[cols, s], transpose_b=True)
    )
    if not recurrent:
      io.d_latent[:, cols] = jnp.where(io.z[:, cols] > 0, d_z, 0.0)
      return
    d_z = d_z + io.d_z_next[:, cols]
    d_c_z_t = io.d_c_z[:, cols] + d_z * io.d_c_z_from_z[:, cols]
    for g in range(GATES):
      gc = at(cols, g * k)
      io.d_latent[:, gc] = io.scales_z[:, gc] * (d_z if g == GATES - 1 else d_c_z_t)
    io.d_c_z_out[:, cols] = d_c_z_t * io.forget_z[:, cols]

  body.each_chunk(k, latent)


def _latent_input_gradients(io, body, n, k, recurrent):
  """The latent's gates' gradients back to h (added to its part from V) and,
  for an LSTM latent, to z_{t-1}."""
  shape = (body.rows, body.chunk)
  latent_width = GATES * k if recurrent else k

  def through_latent(cols, matrix, out, add):
    total = body.summed(
      latent_width,
      shape,
      lambda s: body.product(io.d_latent[:, s], matrix[cols, s], transpose_b=True),
    )
    out[:, cols] = out[:, cols] + total if add else total

  body.each_chunk(n, lambda cols: through_latent(cols, io.latent_h, io.d_h_out, True))
  if recurrent:
    body.each_chunk(k, lambda cols: through_latent(cols, io.latent_u, io.d_z_out, False))


def _outputs(batch, widths):
  return [jax.ShapeDtypeStruct((batch, width), jnp.float32) for width in widths]


def _forward_outputs(batch, m, n, k, recurrent):
  """c_t, h_t, the activations, π, a, r, z (, the latent's activations and c_z)."""
  widths = [n, n, GATES * n, m + 13 * n, GATES * n, GATES * n, k]
  return _outputs(batch, widths + [GATES * k, k] * recurrent)


def _backward_outputs(batch, m, n, k, recurrent):
  """dL/dc_{t-1}, dL/dh, g, q, the x-part, g_z (, dL/dc_z and dL/dz_{t-1})."""
  widths = [n, n, GATES * n, m + 13 * n, m, GATES * k if recurrent else k]
  return _outputs(batch, widths + [k, k] * recurrent)


def forward_step(
  x,
  h,
  mask,
  c,
  latent_in,
  latent_carry,
  weights,
  *,
  cap_input_gate: bool,
  tiles: Tiles,
  dtype: Any,
  interpret: bool | None = None,
):
  """One step: (c_t, h_t, activations (B, 4N), π, a, r (B, 4N), z, and for a
  recurrent latent its activations (B, 4K) and cell state).

  Args:
    x, h, mask, c: x_t (B, M), h_{t-1}, its mask and c_{t-1} (B, N).
    latent_in: x_t W_zx + b_z, (B, 4K) or for a static latent (B, K).
    latent_carry: (c_z, z_{t-1}) (B, K) each, or () for a static latent.
    weights: W_zh, (U_z,) P, W, V, b in the layouts above.
    cap_input_gate: write with min(1 - σ(f), σ(i)) (the activations keep σ(i)).
    tiles: the rows a program owns (`batch`) and the `chunk`.
    dtype: the products' operand dtype (bfloat16 sums in float32).
    interpret: run in Pallas' interpreter (default: off a GPU).
  """
  interpret = resolve_interpret(interpret)
  (batch, m), n = x.shape, h.shape[1]
  recurrent = bool(latent_carry)
  k = latent_in.shape[1] // (GATES if recurrent else 1)
  outs = _forward_outputs(batch, m, n, k, recurrent)
  body = functools.partial(
    _forward_kernel,
    widths=(m, n, k),
    recurrent=recurrent,
    cap_input_gate=cap_input_gate,
    body=RowProgram(tiles.batch, tiles.chunk, dtype, interpret),
  )
  return call_by_rows(
    body,
    'alstm_step_forward',
    [x, h, mask, c, latent_in, *latent_carry],
    list(weights),
    outs,
    tiles,
    interpret,
  )


def backward_step(
  d_out,
  d_rec,
  mask,
  d_c,
  factors,
  x,
  h,
  saved,
  latent,
  weights,
  *,
  tiles: Tiles,
  dtype: Any,
  interpret: bool | None = None,
):
  """One step back: (dL/dc_{t-1}, dL/d(m ⊙ h_{t-1}), the gates' gradients
  (B, 4N), q (B, M + 13N), the x-part of dL/dx_t (B, M), the latent gates'
  gradients, and for a recurrent latent dL/dc_z and dL/dz_{t-1}).

  Args:
    d_out: dL/dh_t from the step's output (B, N).
    d_rec: dL/d(m ⊙ h_t) from the step after (B, N), which this masks.
    mask: m (B, N).
    d_c: dL/dc_t from the step after (B, N).
    factors: (dc_t/dh_t's factor, each gate's derivative factor (B, 4N), σ(f))
      (`lm_zoo.cells.lstm_recurrence.gate_factors`).
    x, h: x_t (B, M) and h_{t-1} (B, N).
    saved: (π, a, r) of the step.
    latent: for a recurrent latent (dL/dc_z, dL/dz from the step after, and
      its factors as `factors`); for a static one (z,).
    weights: W, V, b, P, W_zh (, U_z) in the layouts above.
    tiles, dtype, interpret: as `forward_step`'s.
  """
  interpret = resolve_interpret(interpret)
  (batch, m), n = x.shape, h.shape[1]
  recurrent = len(latent) > 1
  k = latent[0].shape[1]
  outs = _backward_outputs(batch, m, n, k, recurrent)
  body = functools.partial(
    _backward_kernel,
    widths=(m, n, k),
    recurrent=recurrent,
    body=RowProgram(tiles.batch, tiles.chunk, dtype, interpret),
  )
  return call_by_rows(
    body,
    'alstm_step_backward',
    [d_out, d_rec, mask, d_c, *factors, x, h, *saved, *latent],
    list(weights),
    outs,
    tiles,
    interpret,
  )
