"""Building a language model from an `ml_collections` model config."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import ml_collections

from lm_zoo.cells import LSTMCell
from lm_zoo.errors import ConfigError
from lm_zoo.models.language_model import RecurrentLM

# Cell name -> constructor taking `features=`. New cells register here.
CELLS = {
    'lstm': LSTMCell,
    'flax_lstm': nn.OptimizedLSTMCell,
    'gru': nn.GRUCell,
}


def _cell_factory(cfg: ml_collections.ConfigDict):
  if cfg.cell not in CELLS:
    raise ConfigError(f'unknown cell {cfg.cell!r} (model.cell): choose one of '
                      f'{", ".join(CELLS)}')
  if cfg.cell == 'lstm':
    return functools.partial(LSTMCell, forget_bias=cfg.forget_bias)
  return CELLS[cfg.cell]


def build_model(cfg: ml_collections.ConfigDict, vocab_size: int) -> RecurrentLM:
  """A `RecurrentLM` from `config.model` (see experiments/default.py)."""
  for field in ('num_layers', 'embed_size', 'hidden_size'):
    if cfg[field] < 1:
      raise ConfigError(f'model.{field} must be at least 1, got {cfg[field]}')
  for field in ('dropout_input', 'dropout_hidden', 'dropout_state', 'dropout_output'):
    if not 0 <= cfg[field] < 1:
      raise ConfigError(f'model.{field} must be in [0, 1), got {cfg[field]}')
  return RecurrentLM(
      vocab_size=vocab_size,
      embed_size=cfg.embed_size,
      hidden_sizes=(cfg.hidden_size,) * cfg.num_layers,
      cell_factory=_cell_factory(cfg),
      tie_embeddings=cfg.tie_embeddings,
      dropout_input=cfg.dropout_input,
      dropout_hidden=cfg.dropout_hidden,
      dropout_state=cfg.dropout_state,
      dropout_output=cfg.dropout_output,
      unroll=cfg.unroll,
  )


def init_params(model: RecurrentLM, rng: jax.Array, init_scale: float = 0.0):
  """Initial parameters; with `init_scale` > 0 every one is U(±init_scale).

  The uniform option is Zaremba et al.'s initialisation of all weights and
  biases (it replaces the cells' own initialisers, forget bias included).
  """
  init_key, uniform_key = jax.random.split(rng)
  carries = model.initialize_carry(1)
  tokens = jax.numpy.zeros((1, 1), jax.numpy.int32)
  params = model.init(init_key, tokens, carries)['params']
  if init_scale > 0:
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(uniform_key, len(leaves))
    leaves = [jax.random.uniform(k, x.shape, x.dtype, -init_scale, init_scale)
              for k, x in zip(keys, leaves)]
    params = jax.tree.unflatten(treedef, leaves)
  return params
