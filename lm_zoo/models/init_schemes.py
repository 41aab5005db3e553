"""Initialisation schemes (`model.init`): where a model's parameters start.

- `default`: each module's own initialisers (docs/models.md).
- `uniform`: every parameter from U(±init_scale), forget bias included
  (Zaremba et al.'s main.lua).
- `torch`: what the PyTorch code of AWD-LSTM, the mixture of softmaxes and
  the aLSTM draws (torch's defaults): every weight and bias of an LSTM of
  hidden size n from U(±1/√n), with no forget-gate offset (`forget_bias`
  unused; torch's LSTM has two gate biases, `recurrent_bias`, whose sum
  spreads √2 times wider than one); the aLSTM's adaptation LSTM likewise,
  its policy projection and the mixture's prior and latent maps from
  U(±1/√fan_in) (`nn.Linear`); an untied softmax from U(±0.1). The
  embedding (U(±0.1)), the zero output bias and the aLSTM's W and V, each
  orthogonal over the four gates (`orthogonal_per_gate=False`, which this
  scheme asks for), are the default's draws already.
- `lamb`: what deepmind/lamb draws (the Mogrifier paper): every LSTM matrix
  and gate bias from a normal of standard deviation √(1.3 / fan_in) cut at
  two of them (the gate biases' fan-in n, the forget gate's centred on
  `forget_bias`), a full-rank Mogrifier round's matrix too; the embedding
  (V, d) from TensorFlow's variance scaling by fan-out, a normal of
  deviation 1/(0.8796 √d) cut at two; a tied softmax's projection from a
  smaller last layer orthogonal. The low-rank Mogrifier factors, the
  softmax, the mixture's maps and the zero biases are the default's draws
  already; a second gate bias (`recurrent_bias`) stays zero, as lamb has one.

A scheme redraws the parameters it names and keeps the default's draw of the
rest; it refuses a part whose authors' code it does not describe (a GRU, the
Mogrifier, a static adaptation model or a tied softmax's projection under
`torch`; the aLSTM under `lamb`; the dual connection under either).

    >>> params = init_params(model, jax.random.key(0), init='torch')
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells import ALSTMCell, LSTMCell, Mogrify
from lm_zoo.cells.lstm import state_dtype
from lm_zoo.cells.mogrifier import round_name
from lm_zoo.models.heads import MixtureHead, Softmax, TiedSoftmax
from lm_zoo.models.language_model import RecurrentLM

# (key, shape, dtype) -> array, as flax's initialisers
Draw = Callable[..., jax.Array]
# parameter path prefix ('stack/cell_0/input') -> how its parameters are drawn
Draws = dict[str, Draw]


def _uniform(bound: float) -> Draw:
  def draw(key, shape, dtype):
    return jax.random.uniform(key, shape, state_dtype(dtype), -bound, bound).astype(dtype)

  return draw


def _fan_in_uniform(key, shape, dtype):
  """torch's `nn.Linear` default for a (fan_in, out) kernel: U(±1/√fan_in)."""
  return _uniform(1 / math.sqrt(shape[0]))(key, shape, dtype)


def _cut_normal(deviation: float, mean: Any = 0.0) -> Draw:
  """A normal of `deviation` around `mean`, cut at two deviations and not
  rescaled (TensorFlow's truncated_normal)."""

  def draw(key, shape, dtype):
    wide = state_dtype(dtype)
    return (mean + deviation * jax.random.truncated_normal(key, -2, 2, shape, wide)).astype(dtype)

  return draw


def _lamb_fan_in(key, shape, dtype):
  """lamb's `variance_scaling_initializer(1, 'fan_in', 'truncated_normal')`
  for a (fan_in, out) kernel."""
  return _cut_normal(math.sqrt(1.3 / shape[0]))(key, shape, dtype)


def _lamb_gate_bias(n: int, forget_bias: float) -> Draw:
  """lamb's four gate biases (i, f, j, o) of n each: fan-in n, the forget
  gate's centred on `forget_bias`."""
  mean = jnp.zeros(4 * n).at[n : 2 * n].set(forget_bias)
  return _cut_normal(math.sqrt(1.3 / n), mean)


def _refuse(
  scheme: str, part: str, where: str, why: str = "its authors' code has none"
) -> ValueError:
  return ValueError(
    f"init={scheme!r} has no rule for the {part} at {where} ({why}): use init='default'"
  )


def _torch_cell(cell: nn.Module, where: str) -> Draws:
  if type(cell) is LSTMCell:
    return {where: _uniform(1 / math.sqrt(cell.features))}
  if type(cell) is not ALSTMCell:
    raise _refuse('torch', type(cell).__name__, where)
  if cell.latent is not LSTMCell:
    raise _refuse('torch', f'{cell.latent.__name__} adaptation model', f'{where}/latent')
  if cell.orthogonal_per_gate:
    raise _refuse(
      'torch',
      'orthogonal W and V per gate',
      where,
      "the authors' code draws each orthogonal over the four gates: set "
      'orthogonal_per_gate=False (model.alstm.orthogonal_per_gate)',
    )
  return {
    f'{where}/latent': _uniform(1 / math.sqrt(cell.latent_size)),
    f'{where}/policy': _fan_in_uniform,
  }


def _torch_head(head: nn.Module, n: int, d: int) -> Draws:
  """The head's draws under `torch`, for the stack's output size n and the
  embedding's d."""
  if isinstance(head, Softmax):
    return {'head/kernel': _uniform(0.1)}
  if isinstance(head, TiedSoftmax) and n != d:
    raise _refuse(
      'torch',
      f'projection from the last layer ({n}) to the embedding ({d})',
      'head/projection',
      "the authors' code makes the last layer the embedding's size",
    )
  if isinstance(head, TiedSoftmax):
    return {}
  if isinstance(head, MixtureHead):
    return {
      'head/prior': _uniform(1 / math.sqrt(n)),
      'head/latent': _uniform(1 / math.sqrt(n)),
      'head/softmax': _uniform(0.1),
    }
  raise _refuse('torch', type(head).__name__, 'head')


def _lamb_cell(cell: nn.Module, where: str) -> Draws:
  if type(cell) is LSTMCell:
    return {
      f'{where}/input/kernel': _lamb_fan_in,
      f'{where}/recurrent_kernel': _lamb_fan_in,
      f'{where}/input/bias': _lamb_gate_bias(cell.features, cell.forget_bias),
    }
  if type(cell) is Mogrify and type(cell.cell) is LSTMCell:
    draws = _lamb_cell(cell.cell, f'{where}/cell')
    if cell.rank <= 0:  # low-rank factors start as lamb's already (`factor_init`)
      draws.update(
        {f'{where}/{round_name(i)}/kernel': _lamb_fan_in for i in range(1, cell.rounds + 1)}
      )
    return draws
  raise _refuse('lamb', type(cell).__name__, where)


def _lamb_head(head: nn.Module, n: int, d: int) -> Draws:
  if isinstance(head, TiedSoftmax) and n != d:
    return {'head/projection': _orthogonal}  # lm.py's downprojection
  if isinstance(head, (Softmax, TiedSoftmax, MixtureHead)):
    return {}  # lamb's softmax and mixture start as ours
  raise _refuse('lamb', type(head).__name__, 'head')


def _orthogonal(key, shape, dtype):
  return nn.initializers.orthogonal()(key, shape, state_dtype(dtype)).astype(dtype)


def _embedding_fan_out(key, shape, dtype):
  """TensorFlow's `variance_scaling_initializer(1, 'fan_out', 'truncated_normal')`
  of a (V, d) embedding."""
  return _cut_normal(1 / (0.87962566103423978 * math.sqrt(shape[1])))(key, shape, dtype)


Rules = tuple[Callable[[nn.Module, str], Draws], Callable[[nn.Module, int, int], Draws], Draws]
# scheme -> (the draws of a cell at a path, of the head for the stack's output
# size and the embedding's, of the rest); `default` and `uniform` are not rule-based
_RULES: dict[str, Rules] = {
  'torch': (_torch_cell, _torch_head, {}),
  'lamb': (_lamb_cell, _lamb_head, {'embedding/embedding': _embedding_fan_out}),
}
INIT_SCHEMES = ('default', 'uniform', *_RULES)


def scheme_draws(model: RecurrentLM, init: str, init_scale: float = 0.0) -> Draws:
  """What `init` redraws in `model`: parameter path prefix -> draw.

  Raises ValueError for an unknown scheme, a scale that does not go with
  it, or a part of the model the scheme has no rule for.
  """
  if init not in INIT_SCHEMES:
    raise ValueError(f'init must be one of {", ".join(INIT_SCHEMES)}, got {init!r}')
  if (init == 'uniform') != (init_scale > 0):
    raise ValueError(
      f"init_scale={init_scale!r} goes with init='uniform' only, and that needs a scale > 0"
    )
  if init == 'default':
    return {}
  if init == 'uniform':
    return {'': _uniform(init_scale)}
  cell_draws, head_draws, other = _RULES[init]
  if model.bridge is not None:
    raise _refuse(init, type(model.bridge).__name__, 'bridge')
  draws = dict(other)
  for i, cell in enumerate(model.stack.cells):
    draws.update(cell_draws(cell, f'stack/cell_{i}'))
  last = model.stack.cells[-1]
  draws.update(
    head_draws(model.head, getattr(last, 'cell', last).features, model.embedding.features)
  )
  return draws


def _draw_for(path: str, draws: Draws) -> Draw | None:
  """The draw of the longest prefix of `path` in `draws` (whole path parts)."""
  parts = path.split('/')
  for end in range(len(parts), -1, -1):
    draw = draws.get('/'.join(parts[:end]))
    if draw is not None:
      return draw
  return None


def redraw(params, draws: Draws, key: jax.Array):
  """`params` with every leaf under a prefix in `draws` drawn again, each
  from its own key of `key`."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(key, len(leaves))
  new = []
  for k, (path, x) in zip(keys, leaves):
    draw = _draw_for('/'.join(p.key for p in path), draws)
    new.append(x if draw is None else draw(k, x.shape, x.dtype))
  return jax.tree.unflatten(treedef, new)
