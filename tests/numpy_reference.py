"""Independent NumPy versions of the equations the tests check against."""

import numpy as np


def sigmoid(x):
  return 1 / (1 + np.exp(-x))


def lstm_step(params, c, h, x):
  """MODELS.md section 1, gate by gate; params as `LSTMCell`'s (gate order i f j o)."""
  W = np.asarray(params['input']['kernel'])
  b = np.asarray(params['input']['bias'])
  U = np.asarray(params['recurrent_kernel'])
  n = h.shape[-1]
  gate = lambda k: (x @ W[:, k * n:(k + 1) * n] + h @ U[:, k * n:(k + 1) * n]
                    + b[k * n:(k + 1) * n])
  i, f, j, o = sigmoid(gate(0)), sigmoid(gate(1)), np.tanh(gate(2)), sigmoid(gate(3))
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
