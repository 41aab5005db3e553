"""`validate_config`: a config checked before any data is read or anything
compiles, each problem a `ConfigError` naming the field and the fix."""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import ml_collections

from lm_zoo.cells.scans import SCANS
from lm_zoo.data.corpora import CORPORA, Corpus
from lm_zoo.data.text import LEVELS
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import build_evaluator
from lm_zoo.models.factory import (CELLS, DTYPES, LATENTS, LSTM_FAMILY, build_model,
                                   count_params, embed_size)
from lm_zoo.training.averaging import TRIGGERS
from lm_zoo.runs.nonfinite import NONFINITE_POLICIES
from lm_zoo.training.optimizers import LOSS_REDUCTIONS, OPTIMIZERS, SCHEDULES

# field -> the names it may take (the registries themselves, so that a name
# registered later is known)
CHOICES = {
    'data.name': (*CORPORA, 'text', 'tfds'), 'data.level': LEVELS, 'model.cell': CELLS,
    'model.alstm.latent': LATENTS, 'model.dtype': DTYPES, 'model.scan': SCANS,
    'optimizer.name': OPTIMIZERS, 'optimizer.loss_reduction': LOSS_REDUCTIONS,
    'averaging.trigger': TRIGGERS, 'schedule.kind': SCHEDULES,
    'train.nonfinite': NONFINITE_POLICIES,
}
# (fields, test, what the value must be); a NaN fails every test.
RULES = (
    (('data.batch_size', 'data.bptt', 'data.eval_batch_size', 'data.test_batch_size',
      'model.num_layers', 'model.hidden_size', 'model.unroll', 'model.alstm.latent_size',
      'averaging.nonmono', 'train.num_epochs', 'train.log_every'),
     lambda x: x >= 1, 'at least 1'),
    (('data.train_tokens', 'data.valid_tokens', 'data.test_tokens', 'model.embed_size',
      'model.param_budget', 'model.output_size', 'model.mogrifier.rounds',
      'model.dual.size', 'model.mos.components', 'parallel.num_devices', 'optimizer.l2',
      'optimizer.dual_l2', 'optimizer.ar', 'optimizer.tar', 'schedule.decay_after',
      'schedule.min_lr', 'train.max_steps', 'train.max_consecutive_skips',
      'train.max_rollbacks', 'generate.num_lines', 'generate.num_tokens',
      'optimizer.learning_rate', 'train.eval_every',
      'train.max_seconds', 'averaging.patience_steps', 'averaging.latest_step'),
     lambda x: x >= 0, '>= 0'),
    (('model.dropout_embedding', 'model.dropout_input', 'model.dropout_hidden',
      'model.dropout_state', 'model.dropout_output', 'model.weight_drop',
      'model.dual.dropout_input', 'model.dual.dropout_output', 'model.mos.dropout_latent',
      'model.alstm.dropout_latent',
      'optimizer.momentum', 'optimizer.beta1', 'optimizer.beta2', 'train.drop_state'),
     lambda x: 0 <= x < 1, 'in [0, 1) (a rate of 1 would drop or keep everything)'),
    (('optimizer.eps', 'schedule.factor', 'generate.temperature'),
     lambda x: x > 0, 'positive'),
    (('optimizer.clip_norm',), lambda x: x == x, 'a number (<= 0 turns clipping off)'),
    (('model.init_scale',), lambda x: 0 <= x < math.inf,
     'a number >= 0 (0: the cells\' own initialisers)'),
    (('averaging.start_fraction', 'train.rollback_lr_factor'),
     lambda x: 0 < x <= 1, 'in (0, 1]'),
    (('optimizer.learning_rate', 'optimizer.l2', 'optimizer.eps', 'schedule.factor',
      'generate.temperature'), lambda x: x < math.inf, 'finite'),
    (('seed',), lambda x: 0 <= x < 2 ** 32, 'in [0, 2**32) (a PRNG seed)'),
    (('data.batch_size', 'data.bptt', 'data.eval_batch_size', 'data.test_batch_size',
      'model.num_layers', 'model.hidden_size', 'model.embed_size', 'model.output_size',
      'model.alstm.latent_size', 'model.dual.size', 'model.mos.components',
      'model.mogrifier.rounds', 'model.mogrifier.rank'),
     lambda x: x < 2 ** 31, 'below 2**31'),
)
# Bytes a parameter needs at least while training: float32 weights, their
# gradient and two optimizer statistics.
TRAINING_BYTES_PER_PARAM = 16


def _get(config: ml_collections.ConfigDict, field: str) -> Any:
  value = config
  for part in field.split('.'):
    value = value[part]
  return value


def _fail(field: str, value: Any, problem: str) -> ConfigError:
  """The error naming the field, its value, what it must be, and its flag."""
  return ConfigError(f'config field {field}={value!r} {problem} (--config.{field})')


def validate_config(config: ml_collections.ConfigDict, corpus: Corpus | None = None) -> None:
  """Raises ConfigError on the first field of `config` (lm_zoo/configs.py)
  that training cannot use: an unknown name, a size below its minimum, a
  dropout rate outside [0, 1), a Mogrifier rank larger than the matrices it
  factorises. With the loaded `corpus`, also whether each split holds a row
  per batch row, and the BPTT length fits the training rows.
  """
  for field, names in CHOICES.items():
    if _get(config, field) not in names:
      raise _fail(field, _get(config, field), f'is not known: choose one of {", ".join(names)}')
  for fields, test, must_be in RULES:
    for field in fields:
      value = _get(config, field)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not test(value):
        raise _fail(field, value, f'must be {must_be}')
  model = config.model
  if model.cap_input_gate and model.cell not in LSTM_FAMILY:
    raise _fail('model.cap_input_gate', True, f'applies to the cells {", ".join(LSTM_FAMILY)}, '
                f'not model.cell={model.cell!r}: set it False or choose one of them')
  if model.recurrent_bias and model.cell != 'lstm':
    raise _fail('model.recurrent_bias', True, f"applies to model.cell='lstm', not "
                f'model.cell={model.cell!r}: set it False')
  if (model.skip_connections and model.num_layers > 1 and model.output_size
      and (model.param_budget or model.output_size != model.hidden_size)):
    raise _fail('model.skip_connections', True, 'sums the layers\' outputs, which needs '
                f'layers of one size, but model.output_size={model.output_size} sets the '
                'last one apart: set model.output_size=0')
  if model.mogrifier.rounds > 0 and model.mogrifier.rank > 0 and model.param_budget == 0:
    # Q^i, R^i map between each layer's input and hidden state (Melis et al. 2020).
    sizes = {'model.embed_size': embed_size(model, model.hidden_size),
             'model.hidden_size': model.hidden_size}
    if model.output_size:
      sizes['model.output_size'] = model.output_size
    field = min(sizes, key=sizes.get)
    if model.mogrifier.rank > sizes[field]:
      raise _fail('model.mogrifier.rank', model.mogrifier.rank,
                  f'is larger than the matrices it factorises ({field} is {sizes[field]}): '
                  f'a rank of at most {sizes[field]}, or 0 for full rank, is meaningful')
  if (config.train.max_seconds > 0 and jax.distributed.is_initialized()
      and jax.process_count() > 1):
    # Each process's clock would run out after another update, and the
    # processes would wait for each other in different collectives.
    raise _fail('train.max_seconds', config.train.max_seconds,
                'is not kept in step by the processes of a multi-process run: '
                'set train.max_steps instead')
  _check_evaluation(config.evaluation)
  if corpus is not None:
    _check_fit(config, corpus)
    check_memory(config, len(corpus.vocab))


def check_memory(config: ml_collections.ConfigDict, vocab_size: int, copies: int = 1) -> None:
  """Raises ConfigError when `copies` models of `config` (a stack of seeds)
  cannot train in the first device's memory: their parameters, counted from
  shapes alone, times `TRAINING_BYTES_PER_PARAM`, against the device's limit
  (a CPU's physical memory)."""
  params = count_params(build_model(config.model, vocab_size))
  need = params * copies * TRAINING_BYTES_PER_PARAM
  device = jax.local_devices()[0]
  stats = device.memory_stats() or {}
  have = stats.get('bytes_limit') or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  if need > have:
    size = 'model.param_budget' if config.model.param_budget else 'model.hidden_size'
    raise _fail(size, _get(config, size),
                f'gives {copies} x {params:,} parameters, which need at least '
                f'{need / 2 ** 30:,.1f} GiB to train (weights, gradients, optimizer state), '
                f'more than the {have / 2 ** 30:,.1f} GiB of {device.device_kind}: lower it')


def _check_evaluation(evaluation: ml_collections.ConfigDict) -> None:
  """The final evaluation's config can run: a bad field fails before
  training, not after it."""
  if evaluation.evaluator == 'learned':
    raise _fail('evaluation.evaluator', 'learned', 'needs a meta-learner, which is trained '
                'for a finished run (lm-zoo-meta-train): evaluate with it afterwards')
  try:
    build_evaluator(evaluation, bptt=1, batch_size=1)
  except ConfigError as err:
    raise ConfigError(f'config section evaluation (--config.evaluation.*): {err}') from None


def _check_fit(config: ml_collections.ConfigDict, corpus: Corpus) -> None:
  data = config.data
  for split, field in (('train', 'batch_size'), ('valid', 'eval_batch_size'),
                       ('test', 'test_batch_size')):
    pairs = len(corpus.split(split)) - 1
    if data[field] > pairs:
      raise _fail(f'data.{field}', data[field],
                  f'is more rows than the {max(pairs, 0)} (input, target) pairs of the '
                  f'{split} split (data.{split}_tokens={data[f"{split}_tokens"]}) hold: '
                  f'lower it, or keep more {split} tokens')
  row_length = math.ceil((len(corpus.train) - 1) / data.batch_size)
  if data.bptt > row_length:
    raise _fail('data.bptt', data.bptt,
                f'is longer than each of the data.batch_size={data.batch_size} rows the '
                f'training split is cut into ({row_length} steps): lower data.bptt or '
                'data.batch_size, or keep more training tokens')
