"""Building a language model from an `ml_collections` model config."""

from __future__ import annotations

import functools
import logging
import math
from typing import Callable

import flax.linen as nn
import jax
import ml_collections

from lm_zoo.errors import ConfigError
from lm_zoo.models.assembly import assemble
from lm_zoo.models.checks import check_model_config
from lm_zoo.models.init_schemes import redraw, scheme_draws
from lm_zoo.models.language_model import RecurrentLM
from lm_zoo.models.registry import HEADS

log = logging.getLogger(__name__)


def layer_sizes(model: RecurrentLM) -> list[int]:
  """The hidden size of each layer of the model's stack."""
  # A transform (Mogrify) keeps the cell it wraps in `cell`.
  return [getattr(c, 'cell', c).features for c in model.stack.cells]


def describe_model(cfg: ml_collections.ConfigDict, model: RecurrentLM) -> str:
  """The model in words, for the line a run starts with: its cell with the
  transforms around it, layer sizes, head and a scheme of initialisation
  other than the default, e.g. 'Mogrifier lstm (5 rounds, rank 84) 2 x 650,
  embedding 650, skip connections, tied softmax, lamb initialisation'."""
  cell = cfg.cell
  if cfg.cell == 'alstm':
    cell = f'alstm ({cfg.alstm.latent} adaptation, latent {cfg.alstm.latent_size})'
  if cfg.mogrifier.rounds > 0:
    rank = f', rank {cfg.mogrifier.rank}' if cfg.mogrifier.rank > 0 else ''
    zigzag = '' if cfg.mogrifier.zigzag else ', no zigzag'
    cell = f'Mogrifier {cell} ({cfg.mogrifier.rounds} rounds{rank}{zigzag})'
  sizes = layer_sizes(model)
  layers = f'{len(sizes)} x {sizes[0]}' if len(set(sizes)) == 1 else ' + '.join(map(str, sizes))
  parts = [f'{cell} {layers}', f'embedding {model.embedding.features}']
  if cfg.cap_input_gate:
    parts.append('capped input gate')
  if cfg.recurrent_bias:
    parts.append('two gate biases')
  if cfg.skip_connections:
    parts.append('skip connections')
  if cfg.dual.size:
    parts.append(f'dual connection {cfg.dual.size}')
  parts.append(HEADS[cfg.head].describe(cfg))
  if cfg.init != 'default':
    scale = f' ±{cfg.init_scale:g}' if cfg.init == 'uniform' else ''
    parts.append(f'{cfg.init} initialisation{scale}')
  if cfg.dtype != 'float32':
    parts.append(f'{cfg.dtype} products')
  return ', '.join(parts)


def count_params(model: nn.Module) -> int:
  """Number of parameters, computed from shapes only (nothing is allocated):
  one abstract trace of `model.init`."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), *_abstract_inputs(model))
  return sum(x.size for x in jax.tree.leaves(shapes['params']))


def solve_hidden_size(cfg: ml_collections.ConfigDict, vocab_size: int, budget: int) -> int:
  """The largest hidden size whose model has at most `budget` parameters.

  Models are compared at equal parameter counts in the Mogrifier paper (lamb
  fixes a budget and solves for the hidden size). `model.embed_size` = 0
  ties the embedding size to the hidden size, as for tied softmaxes, and
  `model.embed_ratio` >= 0 keeps it a fixed fraction of the hidden size.
  The answer is kept for the process: a run builds its model more than once,
  and each solve traces up to a dozen models.
  """
  return _solve_hidden_size(ml_collections.FrozenConfigDict(cfg), vocab_size, budget)


@functools.lru_cache(maxsize=64)
def _solve_hidden_size(cfg: ml_collections.FrozenConfigDict, vocab_size: int, budget: int) -> int:
  @functools.cache
  def count(n: int) -> int | None:
    try:
      return count_params(assemble(cfg, vocab_size, n))
    except ValueError:  # too small for the Mogrifier's rank
      return None

  low = _first_true(lambda n: count(n) is not None)
  if count(low) > budget:
    raise ConfigError(
      f'model.param_budget {budget:,} is below the smallest model ({count(low):,} parameters)'
    )
  near = _walk_to_budget(count, budget, _quadratic_guess(count, low, budget), low)
  if near is not None:
    return near
  return _first_true(lambda n: count(n) > budget, start=low) - 1


def _quadratic_guess(count: Callable[[int], int], low: int, budget: int) -> int:
  """Where the quadratic through count(low), count(low + s), count(low + 2s)
  reaches `budget`: every size of a model grows with n at most linearly, so
  each count is a quadratic in n up to the rounding of sizes tied to it."""
  step = max(16, low)
  c0, c1, c2 = (count(low + k * step) for k in range(3))
  half_curve, slope = (c2 - 2 * c1 + c0) / 2, (c1 - c0) - (c2 - 2 * c1 + c0) / 2
  if half_curve > 0:  # c0 + slope t + half_curve t^2 = budget
    t = (-slope + math.sqrt(slope * slope + 4 * half_curve * (budget - c0))) / (2 * half_curve)
  else:
    t = (budget - c0) / slope if slope > 0 else 0.0
  return max(low, int(low + t * step))


def _walk_to_budget(
  count: Callable[[int], int], budget: int, guess: int, low: int, steps: int = 8
) -> int | None:
  """The largest n with count(n) <= budget < count(n + 1), found by walking
  from `guess` one size at a time, or None where it lies over `steps` away."""
  n = guess
  for _ in range(steps):
    if count(n) > budget:
      if n == low:
        return None
      n -= 1
    elif count(n + 1) <= budget:
      n += 1
    else:
      return n
  return None


def _first_true(test: Callable[[int], bool], start: int = 1) -> int:
  """The smallest n >= `start` for which `test` holds, where it fails below
  some n and holds from there on: doubling, then bisection."""
  low, high = start - 1, start  # test(low) fails, or low is below start
  while not test(high):
    low, high = high, 2 * high
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (low, mid) if test(mid) else (mid, high)
  return high


def build_model(cfg: ml_collections.ConfigDict, vocab_size: int) -> RecurrentLM:
  """A `RecurrentLM` from `config.model` (fields in lm_zoo/configs.py).

  With `model.param_budget` > 0 the hidden size is solved for that budget and
  `model.hidden_size` is ignored.

  Raises ConfigError where `cfg` cannot build a model (`check_model_config`).
  """
  check_model_config(cfg)
  hidden_size = cfg.hidden_size
  if cfg.param_budget > 0:
    hidden_size = solve_hidden_size(cfg, vocab_size, cfg.param_budget)
    log.info(
      'hidden size %d fits the budget of %s parameters', hidden_size, f'{cfg.param_budget:,}'
    )
  return assemble(cfg, vocab_size, hidden_size)


def _abstract_inputs(model: RecurrentLM):
  """A window of one token and the carries of one row, by shape only."""
  tokens = jax.ShapeDtypeStruct((1, 1), jax.numpy.int32)
  carries = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
    jax.eval_shape(lambda: model.initialize_carry(1)),
  )
  return tokens, carries


def init_params(model: RecurrentLM, rng: jax.Array, init: str = 'default', init_scale: float = 0.0):
  """Initial parameters under the scheme `init` (`lm_zoo.models.init_schemes`):
  'default' (each module's own initialisers), 'uniform' (every parameter
  from U(±init_scale), Zaremba et al.'s), 'torch' or 'lamb' (the authors'
  code's). Raises ValueError for a scheme the model has a part it cannot
  draw, or a scale without 'uniform'.
  """
  draws = scheme_draws(model, init, init_scale)
  init_key, redraw_key = jax.random.split(rng)
  # The inputs by shape only: flax evaluates the initialisers alone (the same
  # values), not the forward pass op by op, each op compiled (seconds a model).
  params = model.lazy_init(init_key, *_abstract_inputs(model))['params']
  return redraw(params, draws, redraw_key) if draws else params
