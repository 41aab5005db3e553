"""Independent NumPy versions of the equations the tests check against."""

import numpy as np


def sigmoid(x):
  return 1 / (1 + np.exp(-x))


def lstm_step(params, c, h, x, cap_input_gate=False):
  """docs/models.md §1, gate by gate; params as `LSTMCell`'s (gate order i f j o).
  `cap_input_gate`: lamb's `tiled_lstm.py`, c' = f c + min(1 - f, i) j."""
  W = np.asarray(params['input']['kernel'])
  b = np.asarray(params['input']['bias'])
  U = np.asarray(params['recurrent_kernel'])
  n = h.shape[-1]
  gate = lambda k: (
    x @ W[:, k * n : (k + 1) * n] + h @ U[:, k * n : (k + 1) * n] + b[k * n : (k + 1) * n]
  )
  i, f, j, o = sigmoid(gate(0)), sigmoid(gate(1)), np.tanh(gate(2)), sigmoid(gate(3))
  if cap_input_gate:
    i = np.minimum(1 - f, i)
  c_new = f * c + i * j
  return c_new, o * np.tanh(c_new)


def linear(params, x):
  """`LowRankDense`: x A B + b, or x W + b at full rank."""
  if 'kernel' in params:
    y = x @ np.asarray(params['kernel'])
  else:
    y = x @ np.asarray(params['kernel_in']) @ np.asarray(params['kernel_out'])
  return y + np.asarray(params['bias'])


def mogrify(params, x, h, rounds, zigzag=True):
  """Mogrifier equations (1) and (2), or the no-zigzag variant."""
  xs = {-1: x}
  hs = {0: h}
  for i in range(1, rounds + 1):
    if i % 2:  # (1): x^i = 2σ(Q^i h^{i-1}) ⊙ x^{i-2}
      src = hs[i - 1] if zigzag else h
      xs[i] = 2 * sigmoid(linear(params[f'q{i}'], src)) * xs[i - 2]
      hs[i] = hs[i - 1]
    else:  # (2): h^i = 2σ(R^i x^{i-1}) ⊙ h^{i-2}
      src = xs[i - 1] if zigzag else x
      hs[i] = 2 * sigmoid(linear(params[f'r{i}'], src)) * hs[i - 2]
      xs[i] = xs[i - 1]
  return xs[max(xs)], hs[max(hs)]


def adaptive_dense(kernels, bias, x, slot_policies, bias_policy=None):
  """Eq. (2) of the aLSTM paper, one example at a time in column-vector form:
  f(x) = D^(q) W^(q-1) ... W^(1) D^(1) x + D^(0) b, with D^(j) = diag(π^(j))
  (the identity where `slot_policies[j]` is None); kernels are (in, out)."""
  out = []
  for b_ in range(x.shape[0]):
    v = x[b_]
    for j, pi in enumerate(slot_policies):
      if j > 0:
        v = np.asarray(kernels[j - 1]).T @ v
      if pi is not None:
        v = np.diag(pi[b_]) @ v
    d0 = np.ones_like(bias) if bias_policy is None else bias_policy[b_]
    out.append(v + np.diag(d0) @ np.asarray(bias))
  return np.stack(out)


def dense(params, x):
  return x @ np.asarray(params['kernel']) + np.asarray(params.get('bias', 0.0))


def alstm_step(params, carry, x, context=None, latent='lstm', latent_mask=None):
  """Eq. (8) gate by gate with tied input adaptations, π = tanh(U z), the
  latent z from an LSTM (eq. 7) or ReLU layer (eq. 6) of v = [x; h; context].
  `latent_mask`: the authors' `dropout_adapt`, z ⊙ mask, kept in the carry."""
  latent_carry, c, h = carry
  v = np.concatenate([x, h] + ([] if context is None else [context]), axis=-1)
  if latent == 'lstm':
    latent_carry = lstm_step(params['latent'], *latent_carry, v)
    z = latent_carry[1]
  else:
    z = np.maximum(dense(params['latent']['Dense_0'], v), 0.0)
  if latent_mask is not None:
    z = z * latent_mask
    if latent == 'lstm':
      latent_carry = (latent_carry[0], z)
  pi = np.tanh(z @ np.asarray(params['policy']['kernel']))
  m, n = x.shape[-1], h.shape[-1]
  d3, d1 = pi[:, :m], pi[:, m : m + n]
  d4, d2, d0 = (pi[:, m + n + k * 4 * n : m + n + (k + 1) * 4 * n] for k in range(3))
  W = np.asarray(params['input']['kernel_1'])
  V = np.asarray(params['recurrent']['kernel_1'])
  b = np.asarray(params['recurrent']['bias'])

  def gate(k):
    s = slice(k * n, (k + 1) * n)
    return d4[:, s] * ((d3 * x) @ W[:, s]) + d2[:, s] * ((d1 * h) @ V[:, s]) + d0[:, s] * b[s]

  i, f, j, o = sigmoid(gate(0)), sigmoid(gate(1)), np.tanh(gate(2)), sigmoid(gate(3))
  c_new = f * c + i * j
  return (latent_carry, c_new, o * np.tanh(c_new))
