"""The robustness study of the aLSTM paper (Flennerhag et al. 2018, section
5.6): train each model with dropout rates drawn uniformly from [r - radius,
r + radius] around its rates r, and compare how validation perplexity spreads.

Every sample index draws one set of rates that all models share (a paired
design: a difference between models is not a difference in their draws).
A run whose loss turns non-finite counts as failing to converge. Each run has
its own work directory, so re-running the study resumes it: finished runs are
read back, the unfinished one resumes from its checkpoint.
"""

from __future__ import annotations

import logging
import math
import pathlib

import ml_collections
import numpy as np

from lm_zoo.errors import ConfigError
from lm_zoo.tasks.runs import train_or_read

log = logging.getLogger(__name__)


def sample_offsets(fields, radius: float, num_samples: int, seed: int) -> list[dict[str, float]]:
  """`num_samples` draws of an offset per field, uniform on [-radius, radius]."""
  if radius < 0:
    raise ConfigError(f'radius must be >= 0, got {radius}')
  rng = np.random.default_rng(seed)
  return [{f: float(rng.uniform(-radius, radius)) for f in fields} for _ in range(num_samples)]


def offset_rates(centres: dict[str, float], offsets: dict[str, float]) -> dict[str, float]:
  """centre + offset per rate, clipped to [0, 0.95] so a rate stays a rate."""
  return {f: float(np.clip(centres[f] + offsets[f], 0.0, 0.95)) for f in offsets}


def run_robustness(config: ml_collections.ConfigDict) -> list[dict]:
  """One row per (sample, model): the sampled rates, validation perplexity
  (inf when the run diverged) and training time.

  `config` (experiments/alstm_robustness.py): `models` maps names to full
  training configs; `rates` lists the dropout fields of `config.model` to
  sample; `radius`, `num_samples`, `seed`; `workdir` holds one directory per
  run, `{workdir}/{model}_{sample}`.
  """
  if not config.models:
    raise ConfigError('config.models is empty: name at least one training config')
  for name, model_config in config.models.items():
    unknown = [f for f in config.rates if f not in model_config.model]
    if unknown:
      raise ConfigError(f'models.{name}.model has no field {", ".join(unknown)}')
  draws = sample_offsets(config.rates, config.radius, config.num_samples, config.seed)
  rows = []
  for sample, offsets in enumerate(draws):
    for name, model_config in config.models.items():
      run_config = ml_collections.ConfigDict(model_config.to_dict())
      rates = offset_rates(model_config.model, offsets)
      run_config.model.update(rates)
      workdir = pathlib.Path(config.workdir) / f'{name}_{sample}'
      summary = train_or_read(run_config, workdir)
      diverged = summary.get('diverged', False)
      row = {
        'model': name,
        'sample': sample,
        **rates,
        'valid_perplexity': math.inf if diverged else summary['valid']['perplexity'],
        'train_seconds': summary.get('train_seconds', math.nan),
        'workdir': str(workdir),
      }
      log.info('%s', row)
      rows.append(row)
  return rows
