"""The model's parts chosen by name in a model config (fields in
lm_zoo/configs.py): cells (`model.cell`), aLSTM adaptation models
(`model.alstm.latent`), computation dtypes (`model.dtype`) and heads
(`model.head`). Adding a cell or a head is its module and one
`register_cell` or `register_head` line; docs/design.md shows both.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from lm_zoo.cells import ALSTMCell, LSTMCell, MLSTMCell, StaticLatent
from lm_zoo.models.heads import MixtureHead, Softmax, TiedSoftmax

# aLSTM adaptation models (model.alstm.latent) -> cell constructor taking
# `features=`. lstm_rhn: LSTM adaptation models wired across layers (eq. 9).
LATENTS = {'lstm': LSTMCell, 'static': StaticLatent, 'lstm_rhn': LSTMCell}


def _alstm(cfg: ml_collections.ConfigDict):
  return functools.partial(
    ALSTMCell,
    latent=LATENTS[cfg.alstm.latent],
    latent_size=cfg.alstm.latent_size,
    forget_bias=cfg.forget_bias,
    cap_input_gate=cfg.cap_input_gate,
    dropout_latent=cfg.alstm.dropout_latent,
    orthogonal_per_gate=cfg.alstm.orthogonal_per_gate,
  )


def _lstm_family(cell_class):
  return lambda cfg: functools.partial(
    cell_class, forget_bias=cfg.forget_bias, cap_input_gate=cfg.cap_input_gate
  )


def _lstm(cfg):
  return functools.partial(_lstm_family(LSTMCell)(cfg), recurrent_bias=cfg.recurrent_bias)


# Cell name -> (model config -> constructor taking `features=` and `dtype=`);
# `register_cell` adds one.
CELLS = {
  'lstm': _lstm,
  'mlstm': _lstm_family(MLSTMCell),
  'alstm': _alstm,
  'flax_lstm': lambda cfg: nn.OptimizedLSTMCell,
  'gru': lambda cfg: nn.GRUCell,
  'simple': lambda cfg: nn.SimpleCell,
}
# The cells that take model.forget_bias and model.cap_input_gate.
LSTM_FAMILY = ['lstm', 'mlstm', 'alstm']


def register_cell(
  name: str,
  make: Callable[[ml_collections.ConfigDict], Callable[..., Any]],
  *,
  lstm_family: bool = False,
) -> None:
  """Makes `model.cell = name` build its layers with `make(model_config)`,
  a constructor taking `features=` and `dtype=` (an `nn.RNNCellBase`);
  `lstm_family`: it takes `forget_bias` and `cap_input_gate` too."""
  CELLS[name] = make
  if lstm_family and name not in LSTM_FAMILY:
    LSTM_FAMILY.append(name)


# model.dtype -> computation dtype (None: float32 from the float32 parameters).
DTYPES = {'float32': None, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class HeadSpec:
  """What `model.head = name` builds, and how a run's first line names it.

  Attributes:
    make: (model config, vocabulary size, computation dtype) -> the head, a
      module mapping the stack's output h (B, T, n) and the embedding
      matrix E (V, d) to logits or log-probabilities (B, T, V).
    describe: model config -> the head in words ('tied softmax').
    section: the model config section only this head reads ('mos'), if
      any; a config that changes it while choosing another head is refused.
  """

  make: Callable[[ml_collections.ConfigDict, int, Any], nn.Module]
  describe: Callable[[ml_collections.ConfigDict], str]
  section: str | None = None


def _softmax_words(cfg: ml_collections.ConfigDict) -> str:
  return 'tied softmax' if cfg.tie_embeddings else 'softmax'


# Head name -> its `HeadSpec`; `register_head` adds one.
HEADS = {
  'softmax': HeadSpec(
    make=lambda cfg, vocab_size, dtype: (TiedSoftmax if cfg.tie_embeddings else Softmax)(
      vocab_size, dtype
    ),
    describe=_softmax_words,
  ),
  'mos': HeadSpec(
    make=lambda cfg, vocab_size, dtype: MixtureHead(
      vocab_size,
      cfg.mos.components,
      cfg.mos.dropout_latent,
      cfg.variational_dropout,
      cfg.tie_embeddings,
      dtype,
    ),
    describe=lambda cfg: f'mixture of {cfg.mos.components} {_softmax_words(cfg)}es',
    section='mos',
  ),
}


def register_head(name: str, spec: HeadSpec) -> None:
  """Makes `model.head = name` build the head `spec` describes."""
  HEADS[name] = spec
