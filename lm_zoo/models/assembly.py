"""Assembling a `RecurrentLM` from its parts as a checked model config names them."""

from __future__ import annotations

import functools

import ml_collections

from lm_zoo.cells import LSTMRHNStack, mogrified, resolve_scan
from lm_zoo.errors import ConfigError
from lm_zoo.models.heads import Dual
from lm_zoo.models.language_model import Embedding, RecurrentLM
from lm_zoo.models.registry import CELLS, DTYPES, HEADS
from lm_zoo.models.sizes import embed_size
from lm_zoo.models.stacks import LSTMRHN, Stack


def _lstm_rhn(cfg: ml_collections.ConfigDict) -> bool:
  """Whether the layers are wired as the LSTM-RHN (aLSTM layers stepped together)."""
  return cfg.cell == 'alstm' and cfg.alstm.latent == 'lstm_rhn'


def compute_dtype(cfg: ml_collections.ConfigDict):
  """The computation dtype of `model.dtype`; parameters stay float32."""
  return DTYPES[cfg.dtype]


def _cell_factory(cfg: ml_collections.ConfigDict):
  """The constructor of one layer's cell: `model.cell` computing in
  `model.dtype`, mogrified when `model.mogrifier.rounds` > 0."""
  dtype = compute_dtype(cfg)
  make_cell = functools.partial(CELLS[cfg.cell](cfg), dtype=dtype)
  mog = cfg.mogrifier
  if mog.rounds == 0:
    return make_cell
  return mogrified(make_cell, mog.rounds, mog.rank, mog.zigzag, dtype)


def _stack(cfg: ml_collections.ConfigDict, cells) -> Stack | LSTMRHN:
  rates = dict(
    dropout_hidden=cfg.dropout_hidden,
    dropout_state=cfg.dropout_state,
    dropout_output=cfg.dropout_output,
    weight_drop=cfg.weight_drop,
  )
  if _lstm_rhn(cfg):
    stack, layer = LSTMRHN(cells, **rates, unroll=cfg.unroll, scan=cfg.scan), LSTMRHNStack(cells)
    masked = False  # the stack drops its fed-back states itself, with no layer mask
  else:
    stack = Stack(
      cells,
      **rates,
      variational=cfg.variational_dropout,
      skip_connections=cfg.skip_connections,
      unroll=cfg.unroll,
      scan=cfg.scan,
    )
    layer, masked = cells[0], cfg.dropout_state > 0
  try:  # refused now, not when the model first runs
    resolve_scan(layer, cfg.scan, state_mask=masked)
  except ValueError as err:
    raise ConfigError(f'model.{err} (--config.model.scan)') from None
  return stack


def assemble(cfg: ml_collections.ConfigDict, vocab_size: int, hidden_size: int) -> RecurrentLM:
  """The model of the checked config `cfg` at `hidden_size`, its parts built
  (no parameters drawn)."""
  dtype = compute_dtype(cfg)
  make_cell = _cell_factory(cfg)
  sizes = (hidden_size,) * (cfg.num_layers - 1) + (cfg.output_size or hidden_size,)
  cells = tuple(make_cell(features=n, parent=None) for n in sizes)
  dual = cfg.dual
  return RecurrentLM(
    embedding=Embedding(
      vocab_size,
      embed_size(cfg, hidden_size),
      cfg.dropout_embedding,
      cfg.dropout_input,
      cfg.variational_dropout,
      dtype=dtype,
    ),
    stack=_stack(cfg, cells),
    bridge=(
      Dual(dual.size, dual.dropout_input, dual.dropout_output, cfg.variational_dropout, dtype)
      if dual.size
      else None
    ),
    head=HEADS[cfg.head].make(cfg, vocab_size, dtype),
  )
