"""`validate_config`: a config checked before any data is read or anything
compiles, each problem a `ConfigError` naming the field and the fix."""

from __future__ import annotations

import math
import os

import jax
import ml_collections

from lm_zoo.configs import check_fields, field_error, field_value
from lm_zoo.data.corpora import CORPORA, Corpus
from lm_zoo.data.text import LEVELS
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import build_evaluator, needs_meta_learner
from lm_zoo.models import build_model, check_model_config, count_params
from lm_zoo.runs.nonfinite import NONFINITE_POLICIES
from lm_zoo.training.averaging import TRIGGERS
from lm_zoo.training.optimizers import LOSS_REDUCTIONS, OPTIMIZERS, SCHEDULES

# field -> the names it may take (the registries themselves, so that a name
# registered later is known); the model's are `lm_zoo.models.checks`'.
CHOICES = {
  'data.name': (*CORPORA, 'text', 'tfds'),
  'data.level': LEVELS,
  'optimizer.name': OPTIMIZERS,
  'optimizer.loss_reduction': LOSS_REDUCTIONS,
  'averaging.trigger': TRIGGERS,
  'schedule.kind': SCHEDULES,
  'train.nonfinite': NONFINITE_POLICIES,
}
# (fields, test, what the value must be); a NaN fails every test.
RULES = (
  (
    (
      'data.batch_size',
      'data.bptt',
      'data.eval_batch_size',
      'data.test_batch_size',
      'data.pad_windows_to',
      'averaging.nonmono',
      'train.num_epochs',
      'train.log_every',
    ),
    lambda x: x >= 1,
    'at least 1',
  ),
  (
    (
      'data.train_tokens',
      'data.valid_tokens',
      'data.test_tokens',
      'parallel.num_devices',
      'optimizer.l2',
      'optimizer.dual_l2',
      'optimizer.ar',
      'optimizer.tar',
      'schedule.decay_after',
      'schedule.min_lr',
      'train.max_steps',
      'train.max_consecutive_skips',
      'train.max_rollbacks',
      'generate.num_lines',
      'generate.num_tokens',
      'optimizer.learning_rate',
      'train.eval_every',
      'train.max_seconds',
      'averaging.patience_steps',
      'averaging.latest_step',
    ),
    lambda x: x >= 0,
    '>= 0',
  ),
  (
    ('optimizer.momentum', 'optimizer.beta1', 'optimizer.beta2', 'train.drop_state'),
    lambda x: 0 <= x < 1,
    'in [0, 1) (a rate of 1 would drop or keep everything)',
  ),
  (('optimizer.eps', 'schedule.factor', 'generate.temperature'), lambda x: x > 0, 'positive'),
  (('optimizer.clip_norm',), lambda x: x == x, 'a number (<= 0 turns clipping off)'),
  (('averaging.start_fraction', 'train.rollback_lr_factor'), lambda x: 0 < x <= 1, 'in (0, 1]'),
  (
    (
      'optimizer.learning_rate',
      'optimizer.l2',
      'optimizer.eps',
      'schedule.factor',
      'generate.temperature',
    ),
    lambda x: x < math.inf,
    'finite',
  ),
  (('seed',), lambda x: 0 <= x < 2**32, 'in [0, 2**32) (a PRNG seed)'),
  (
    (
      'data.batch_size',
      'data.bptt',
      'data.eval_batch_size',
      'data.test_batch_size',
      'data.pad_windows_to',
    ),
    lambda x: x < 2**31,
    'below 2**31',
  ),
)
# Bytes a parameter needs at least while training: float32 weights, their
# gradient and two optimizer statistics.
TRAINING_BYTES_PER_PARAM = 16


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError on the first field of `config` (lm_zoo/configs.py)
  that training cannot use: an unknown name, a size below its minimum, a
  dropout rate outside [0, 1), a Mogrifier rank larger than the matrices it
  factorises. What the data decides is `check_against_corpus`'s.
  """
  check_fields(config, CHOICES, RULES)
  check_model_config(config.model)
  if config.train.max_seconds > 0 and jax.distributed.is_initialized() and jax.process_count() > 1:
    # Each process's clock would run out after another update, and the
    # processes would wait for each other in different collectives.
    raise field_error(
      'train.max_seconds',
      config.train.max_seconds,
      'is not kept in step by the processes of a multi-process run: set train.max_steps instead',
    )
  if config.data.variable_bptt and config.data.pad_windows_to > config.data.bptt:
    # Every window would be padded to it: mostly steps computed for nothing.
    raise field_error(
      'data.pad_windows_to',
      config.data.pad_windows_to,
      f'is longer than data.bptt={config.data.bptt}, the windows it pads: choose a '
      'small multiple such as 8',
    )
  _check_evaluation(config.evaluation)


def check_against_corpus(
  config: ml_collections.ConfigDict, corpus: Corpus, copies: int = 1
) -> None:
  """Raises ConfigError unless each split of the loaded `corpus` holds a row
  per batch row, the BPTT length fits the training rows, and `copies`
  models of `config` (a stack of seeds) fit the device (`check_memory`)."""
  _check_fit(config, corpus)
  check_memory(config, len(corpus.vocab), copies)


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
    raise field_error(
      size,
      field_value(config, size),
      f'gives {copies} x {params:,} parameters, which need at least '
      f'{need / 2**30:,.1f} GiB to train (weights, gradients, optimizer state), '
      f'more than the {have / 2**30:,.1f} GiB of {device.device_kind}: lower it',
    )


def _check_evaluation(evaluation: ml_collections.ConfigDict) -> None:
  """The final evaluation's config can run: a bad field fails before
  training, not after it."""
  if needs_meta_learner(evaluation):
    raise field_error(
      'evaluation.evaluator',
      evaluation.evaluator,
      'needs a meta-learner, which is trained '
      'for a finished run (lm-zoo-meta-train): evaluate with it afterwards',
    )
  try:
    build_evaluator(evaluation, bptt=1, batch_size=1)
  except ConfigError as err:
    raise ConfigError(f'config section evaluation (--config.evaluation.*): {err}') from None


def _check_fit(config: ml_collections.ConfigDict, corpus: Corpus) -> None:
  data = config.data
  for split, field in (
    ('train', 'batch_size'),
    ('valid', 'eval_batch_size'),
    ('test', 'test_batch_size'),
  ):
    pairs = len(corpus.split(split)) - 1
    if data[field] > pairs:
      raise field_error(
        f'data.{field}',
        data[field],
        f'is more rows than the {max(pairs, 0)} (input, target) pairs of the '
        f'{split} split (data.{split}_tokens={data[f"{split}_tokens"]}) hold: '
        f'lower it, or keep more {split} tokens',
      )
  row_length = math.ceil((len(corpus.train) - 1) / data.batch_size)
  if data.bptt > row_length:
    raise field_error(
      'data.bptt',
      data.bptt,
      f'is longer than each of the data.batch_size={data.batch_size} rows the '
      f'training split is cut into ({row_length} steps): lower data.bptt or '
      'data.batch_size, or keep more training tokens',
    )
