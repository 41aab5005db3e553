"""A finished run read back: its config (`load_config`), vocabulary
(`load_vocab`), data check (`check_data`), seeds (`load_seeds`) and best
weights (`best_params`), and all of them at once as the model to use
(`load_model`, without the training data; `load_trained`, with it). A run is
a work directory, a preset (`lm_zoo.presets`) or a preset's URL
(`lm_zoo.remote.resolve`).

  config, vocab, model, params = load_model('runs/small')
  logits, _ = model.apply({'params': params}, tokens, model.initialize_carry(len(tokens)))

(`tokens`: ids (batch, time), as `vocab` numbers the words.)
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import ml_collections

from lm_zoo.configs import base_config, unknown_fields
from lm_zoo.data import Corpus, Vocab, load_data
from lm_zoo.data.corpora import SPLITS, vocab_sha256
from lm_zoo.errors import ConfigError
from lm_zoo.models import RecurrentLM, build_model, init_params
from lm_zoo.presets import is_preset, load_params
from lm_zoo.remote import resolve
from lm_zoo.runs.checkpoints import FORMAT_VERSION, Checkpoints
from lm_zoo.runs.files import (
  CONFIG_FILE,
  DATA_FILE,
  SEEDS_FILE,
  VOCAB_FILE,
  read_json,
)
from lm_zoo.version import check_format


def load_config(workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
  """The config a work directory was trained with.

  Raises:
    ConfigError: config.json is missing, does not parse, or was written in
      another format than this lm_zoo's (`FORMAT_VERSION`).
  """
  path = pathlib.Path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise ConfigError(f'{path} not found: is {workdir} a work directory written by lm-zoo-train?')
  try:
    saved = json.loads(path.read_text())
  except ValueError as err:
    raise ConfigError(
      f'{path} is corrupt or truncated ({err}): restore it, or train again in a new --workdir'
    ) from None
  if not isinstance(saved, dict):
    raise ConfigError(
      f'{path} holds no config (a JSON {type(saved).__name__}): restore it, '
      'or train again in a new --workdir'
    )
  fix = 'use that lm_zoo for it, or train again in a new --workdir'
  saved = check_format(saved, FORMAT_VERSION, str(workdir), fix)
  config = base_config()
  unknown = unknown_fields(saved, json.loads(config.to_json_best_effort()))
  if unknown:
    raise ConfigError(
      f'{path} has fields this lm_zoo does not know: {", ".join(unknown[:5])}'
      + (f' and {len(unknown) - 5} more' if len(unknown) > 5 else '')
      + ': it was edited or written by another version; restore it, or train '
      'again in a new --workdir'
    )
  config.update(saved)
  return config


def load_vocab(workdir: str | pathlib.Path) -> Vocab:
  """The vocabulary a run trained with (WORKDIR/vocab.json), checked against
  the fingerprint of the run's data (WORKDIR/data.json): a renamed or
  reordered token would map ids to other words."""
  workdir = pathlib.Path(workdir)
  saved = read_json(workdir / VOCAB_FILE, 'every work directory keeps its vocabulary')
  fingerprint = read_json(
    workdir / DATA_FILE, 'every work directory keeps the fingerprint of its data'
  )
  try:
    vocab = Vocab(tuple(saved['tokens']), kind=saved['kind'])
  except (KeyError, TypeError, ValueError) as err:
    raise ConfigError(
      f'{workdir / VOCAB_FILE} is damaged (no valid {err}): restore it, or '
      'train again in a new --workdir'
    ) from None
  if vocab_sha256(vocab) != fingerprint.get('vocab_sha256'):
    raise ConfigError(
      f'{workdir / VOCAB_FILE} is not the vocabulary the run trained with '
      f"(its sha256 differs from {workdir / DATA_FILE}'s): restore it, or "
      'train again in a new --workdir'
    )
  return vocab


def check_data(corpus: Corpus, workdir: str | pathlib.Path) -> None:
  """Raises ConfigError when `corpus` is not the data the run in `workdir`
  was trained on (its vocabulary, or a split, differs from data.json): the
  ids would map to other words, and the scores mean nothing."""
  path = pathlib.Path(workdir) / DATA_FILE
  saved = read_json(path, 'every work directory keeps the fingerprint of its data')
  now = corpus.fingerprint()
  differ = [key for key in ('vocab_sha256', *SPLITS) if saved.get(key) != now[key]]
  if differ:
    what = (
      'the vocabulary'
      if differ[0] == 'vocab_sha256'
      else f"the {differ[0]} split ({now[differ[0]]['tokens']:,} tokens, the run's had "
      f'{saved[differ[0]]["tokens"]:,})'
    )
    raise ConfigError(
      f'the {corpus.name} data differs from what {workdir} was trained on: '
      f"{what} is another ({path} has the fingerprint of the run's "
      "data). Point the program's --data_dir at the files the run used."
    )


def load_seeds(workdir: str | pathlib.Path) -> list[int] | None:
  """The seeds of the stack in `workdir`; None for a run alone."""
  path = pathlib.Path(workdir) / SEEDS_FILE
  if not path.is_file():
    return None
  seeds = read_json(path, 'a stack keeps its seeds')
  if not (isinstance(seeds, dict) and isinstance(seeds.get('seeds'), list)):
    raise ConfigError(
      f'{path} holds no list of seeds: restore it, or train again in a new --workdir'
    )
  return seeds['seeds']


def check_init_from(workdir: str | pathlib.Path) -> None:
  """Raises ConfigError unless `workdir` (train.init_from) is a work
  directory of lm-zoo-train."""
  if not (pathlib.Path(workdir) / CONFIG_FILE).is_file():
    raise ConfigError(f'train.init_from={workdir} is not a work directory of lm-zoo-train')


def initial_params(workdir: str | pathlib.Path, like: Any) -> Any:
  """The best weights of the run in `workdir`, shaped as `like` (a fine-tuning
  stage starts from them)."""
  check_init_from(workdir)
  return best_params(workdir, like, f'train.init_from={workdir}')[0]


def load_model(
  workdir: str | pathlib.Path,
) -> tuple[ml_collections.ConfigDict, Vocab, RecurrentLM, Any]:
  """(config, vocabulary, model, best parameters) of a work directory,
  without its training data: the vocabulary is the one the run saved.
  `workdir` may be a preset too (`lm_zoo.presets`), or its URL
  (`lm_zoo.remote.resolve`)."""
  workdir = resolve(workdir)
  config = load_config(workdir)
  vocab = load_vocab(workdir)
  model = build_model(config.model, len(vocab))
  return config, vocab, model, _model_params(workdir, model)


def load_trained(
  workdir: str | pathlib.Path, data_dir: str | None = None
) -> tuple[ml_collections.ConfigDict, Corpus, RecurrentLM, Any]:
  """(config, corpus, model, best parameters) of a work directory, its data
  read from `data_dir` when given, else from where the run recorded.
  `workdir` may be a preset too (`lm_zoo.presets`), or its URL
  (`lm_zoo.remote.resolve`)."""
  workdir = resolve(workdir)
  config = load_config(workdir)
  if data_dir:
    config.data.data_dir = data_dir
  corpus = load_data(config)
  check_data(corpus, workdir)
  model = build_model(config.model, len(corpus.vocab))
  return config, corpus, model, _model_params(workdir, model)


def best_params(workdir: str | pathlib.Path, like: Any, name: str = '') -> tuple[Any, dict]:
  """(the best weights, shaped as `like`, and their checkpoint's meta) of a
  work directory or a preset (whose meta is empty); `name` is how an error
  names `workdir`.

  Raises:
    ConfigError: the run has not finished an epoch, so has no best weights.
  """
  if is_preset(workdir):
    return load_params(workdir, like), {}
  with Checkpoints(workdir) as checkpoints:  # closed
    best = checkpoints.restore_best(like)
  if best is None:
    raise ConfigError(
      f'{name + ": " if name else ""}no best checkpoint in {workdir}/best: '
      'training has not finished an epoch yet'
    )
  return best


def _model_params(workdir: str | pathlib.Path, model: RecurrentLM) -> Any:
  like = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  return best_params(workdir, like)[0]
