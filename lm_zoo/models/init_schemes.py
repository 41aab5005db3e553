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
  deviation 1/(0.8796 √d) cut at two; a tied softmax's projection, where
  the last layer's size is not the embedding's, orthogonal. The low-rank Mogrifier factors, the
  softmax, the mixture's maps and the zero biases are the default's draws
  already; a second gate bias (`recurrent_bias`) stays zero, as lamb has one.

A scheme redraws the parameters it names and keeps the default's draw of the
rest. It draws the parts its authors' code has and refuses any other in one
line: `torch` the lstm and alstm cells (an LSTM adaptation model, W and V
orthogonal over the gates), the softmax without a projection and the
mixture; `lamb` the lstm cell, mogrified or not, and every head; neither
the dual connection.

    >>> params = init_params(model, jax.random.key(0), init='torch')
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells import ALSTMCell, LSTMCell, Mogrify
from lm_zoo.cells.lstm import drawn_wide, state_dtype
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


class Refused(ValueError):
  """A part of a model that a scheme has no rule for."""


def _refuse(part: str, where: str, why: str, fix: str = "use init='default'") -> Refused:
  return Refused(f'has no rule for the {part} at {where} ({why}): {fix}')


def _lacked(cell: nn.Module, where: str) -> Refused:
  """The refusal of a cell whose authors' code the scheme does not describe."""
  part = type(cell).__name__
  if type(cell) is Mogrify and type(cell.cell) is not LSTMCell:
    part = f'{type(cell.cell).__name__} inside Mogrify'
  return _refuse(part, where, "its authors' code has none")


def _torch_cell(cell: nn.Module, where: str) -> Draws:
  if type(cell) is LSTMCell:
    return {where: _uniform(1 / math.sqrt(cell.features))}
  if type(cell) is not ALSTMCell:
    raise _lacked(cell, where)
  if cell.latent is not LSTMCell:
    raise _refuse(
      f'{cell.latent.__name__} adaptation model', f'{where}/latent', "the authors' is an LSTM"
    )
  if cell.orthogonal_per_gate:
    raise _refuse(
      'W and V orthogonal per gate',
      where,
      "the authors' code draws each over the four gates",
      "set orthogonal_per_gate=False, or use init='default'",
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
      f'projection from the last layer ({n}) to the embedding ({d})',
      'head/projection',
      "the authors' code makes the last layer the embedding's size",
      "give the last layer the embedding's size (output_size), or use init='default'",
    )
  if isinstance(head, TiedSoftmax):
    return {}
  if isinstance(head, MixtureHead):
    draws = {'head/prior': _uniform(1 / math.sqrt(n)), 'head/latent': _uniform(1 / math.sqrt(n))}
    return draws if head.tied else {**draws, 'head/softmax': _uniform(0.1)}
  raise _refuse(type(head).__name__, 'head', "its authors' code has none")


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
  raise _lacked(cell, where)


def _lamb_head(head: nn.Module, n: int, d: int) -> Draws:
  if isinstance(head, TiedSoftmax) and n != d:
    return {'head/projection': _orthogonal}  # lm.py's downprojection
  if isinstance(head, (Softmax, TiedSoftmax, MixtureHead)):
    return {}  # lamb's softmax and mixture start as ours
  raise _refuse(type(head).__name__, 'head', "its authors' code has none")


_orthogonal = drawn_wide(nn.initializers.orthogonal())
# TensorFlow's variance_scaling_initializer(1, 'fan_out', 'truncated_normal') of a
# (V, d) embedding, which flax's is
_embedding_fan_out = drawn_wide(
  nn.initializers.variance_scaling(1.0, 'fan_out', 'truncated_normal')
)


Rules = tuple[Callable[[nn.Module, str], Draws], Callable[[nn.Module, int, int], Draws], Draws]
# scheme -> (the draws of a cell at a path, of the head for the stack's output
# size and the embedding's, of the rest); `default` and `uniform` are not rule-based
_RULES: dict[str, Rules] = {
  'torch': (_torch_cell, _torch_head, {}),
  'lamb': (_lamb_cell, _lamb_head, {'embedding/embedding': _embedding_fan_out}),
}
INIT_SCHEMES = ('default', 'uniform', *_RULES)
# the schemes whose rules name the parts they draw (and refuse the rest)
RULE_SCHEMES = tuple(_RULES)


def _rule_draws(model: RecurrentLM, init: str) -> Draws:
  """The draws of the rule-based scheme `init`; raises `Refused`."""
  cell_draws, head_draws, other = _RULES[init]
  if model.bridge is not None:
    raise _refuse(type(model.bridge).__name__, 'bridge', "its authors' code has none")
  draws = dict(other)
  for i, cell in enumerate(model.stack.cells):
    draws.update(cell_draws(cell, f'stack/cell_{i}'))
  last = model.stack.cells[-1]
  n, d = getattr(last, 'cell', last).features, model.embedding.features
  return {**draws, **head_draws(model.head, n, d)}


def refusal(model: RecurrentLM, init: str) -> str | None:
  """Why the scheme `init` cannot draw `model` ('has no rule for ...'), or
  None where it can."""
  if init not in _RULES:
    return None
  try:
    _rule_draws(model, init)
  except Refused as err:
    return str(err)
  return None


def scheme_draws(model: RecurrentLM, init: str, init_scale: float = 0.0) -> Draws:
  """What `init` redraws in `model`: parameter path prefix -> draw.

  Raises ValueError for an unknown scheme, a scale that does not go with
  it, or a part of the model the scheme has no rule for.
  """
  if init not in INIT_SCHEMES:
    raise ValueError(f'init must be one of {", ".join(INIT_SCHEMES)}, got {init!r}')
  if init == 'uniform' and not init_scale > 0:
    raise ValueError(f"init='uniform' needs init_scale > 0, got {init_scale!r}")
  if init != 'uniform' and init_scale != 0:
    raise ValueError(f"init_scale={init_scale!r} applies to init='uniform' only: set it 0")
  if init == 'default':
    return {}
  if init == 'uniform':
    return {'': _uniform(init_scale)}
  try:
    return _rule_draws(model, init)
  except Refused as err:
    raise ValueError(f'init={init!r} {err}') from None


def _prefix_for(path: str, draws: Draws) -> str | None:
  """The longest prefix of `path` in `draws`, in whole path parts."""
  parts = path.split('/')
  for end in range(len(parts), -1, -1):
    if '/'.join(parts[:end]) in draws:
      return '/'.join(parts[:end])
  return None


def redraw(params, draws: Draws, key: jax.Array):
  """`params` with every leaf under a prefix in `draws` drawn again, each
  from its own key of `key`. Raises ValueError for a prefix that names no
  parameter (a part renamed under the scheme's rules)."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(key, len(leaves))
  new, used = [], set()
  for k, (path, x) in zip(keys, leaves):
    prefix = _prefix_for('/'.join(p.key for p in path), draws)
    used.add(prefix)
    new.append(x if prefix is None else draws[prefix](k, x.shape, x.dtype))
  if set(draws) - used:
    raise ValueError(f'the scheme names parameters the model lacks: {sorted(set(draws) - used)}')
  return jax.tree.unflatten(treedef, new)
