"""A finished work directory: its model with the best weights
(`load_trained`), scored on any split (`evaluate_workdir`)."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import jax
import ml_collections

from lm_zoo.data import Corpus
from lm_zoo.errors import ConfigError
from lm_zoo.models import RecurrentLM, build_model, init_params, legacy_transposed
from lm_zoo.training.checkpoints import Checkpoints
from lm_zoo.training.evaluation import EvalResult, evaluate_stream, tune_temperature
from lm_zoo.training.loop import load_data
from lm_zoo.training.workdir import load_config
from lm_zoo.training.steps import (make_eval_step, make_mc_dropout_eval_step,
                                   mc_dropout_carries, with_dropout_scaled)

log = logging.getLogger(__name__)


def load_trained(workdir: str | pathlib.Path, data_dir: str | None = None
                 ) -> tuple[ml_collections.ConfigDict, Corpus, RecurrentLM, Any]:
  """(config, corpus, model, best parameters) of a work directory."""
  config = load_config(workdir)
  if data_dir:
    config.data.data_dir = data_dir
  corpus = load_data(config)
  model = build_model(config.model, len(corpus.vocab))
  like = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  with Checkpoints(workdir, legacy_transposed=legacy_transposed) as checkpoints:  # closed
    best = checkpoints.restore_best(like)
  if best is None:
    raise ConfigError(f'no best checkpoint in {workdir}/best: training has not '
                      'finished an epoch yet')
  return config, corpus, model, best[0]


def evaluate_workdir(workdir: str | pathlib.Path, splits=('valid', 'test'),
                     batch_size: int = 0, data_dir: str | None = None,
                     mc_samples: int = 0, dropout_scale: float = 1.0,
                     temperature: float | str = 1.0, seed: int = 0
                     ) -> dict[str, EvalResult]:
  """Evaluates the best checkpoint of a work directory on `splits`.

  Args:
    batch_size: evaluation batch size; 0 takes the config's test_batch_size.
    mc_samples: > 0 averages the predicted probabilities over that many
      dropout masks (Monte-Carlo dropout), the model's dropout rates
      multiplied by `dropout_scale`; 0 evaluates with dropout off.
    temperature: the softmax temperature, or 'tune' for the one that
      minimises the validation loss (`tune_temperature`), then used on every
      split; each result records its temperature.
    seed: the MC-dropout masks' seed.
  """
  config, corpus, model, params = load_trained(workdir, data_dir)
  batch_size = batch_size or config.data.test_batch_size
  if mc_samples > 0:
    try:
      model = with_dropout_scaled(model, dropout_scale)
    except ValueError as err:
      raise ConfigError(f'dropout_scale: {err}') from err
    eval_step = make_mc_dropout_eval_step(model, mc_samples)
    carries = lambda: mc_dropout_carries(model, batch_size, mc_samples,
                                         jax.random.key(seed))
  else:
    eval_step = make_eval_step(model)
    carries = lambda: model.initialize_carry(batch_size)

  def evaluate(split: str, temperature: float) -> EvalResult:
    return evaluate_stream(eval_step, params, carries(), corpus.split(split), batch_size,
                           config.data.bptt, corpus.unit, temperature,
                           what=f'{split} evaluation')

  if temperature == 'tune':
    temperature = tune_temperature(lambda t: evaluate('valid', t).loss)
    log.info('softmax temperature %.3f minimises the validation loss', temperature)
  elif isinstance(temperature, str) or temperature <= 0:
    raise ConfigError(f"temperature must be a positive number or 'tune', got {temperature!r}")
  return {split: evaluate(split, temperature) for split in splits}
