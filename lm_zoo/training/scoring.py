"""How a run scores and samples a model: each validation turn
(`score_split`), the final evaluation by the evaluator the config's
`evaluation` section names (`final_scores`), and `sample_text` (with
`record_samples`, what a run's end does with it)."""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from lm_zoo import generation
from lm_zoo.data import Corpus
from lm_zoo.evaluation import EvalResult, evaluate_split
from lm_zoo.models import RecurrentLM
from lm_zoo.runs.metrics import MetricsWriter
from lm_zoo.training.run import Trainer
from lm_zoo.training.trained import workdir_evaluator

log = logging.getLogger(__name__)


def sample_text(
  model: RecurrentLM,
  params: Any,
  corpus: Corpus,
  num_lines: int,
  num_tokens: int,
  seed: int,
  temperature: float,
) -> list[str]:
  """`num_lines` samples, each started after an end of sentence."""
  prompt = np.full((num_lines, 1), generation.start_id(corpus.vocab), np.int32)
  ids = generation.sample(model, params, prompt, num_tokens, jax.random.key(seed), temperature)
  return [corpus.vocab.decode(row).strip().replace('\n', ' | ') for row in ids]


def record_samples(
  model: RecurrentLM,
  params: Any,
  corpus: Corpus,
  config: ml_collections.ConfigDict,
  metrics: MetricsWriter,
  step: int,
  tag: str = 'samples',
  label: str = 'sample',
) -> list[str]:
  """`config.generate`'s samples (`sample_text`, drawn with `config.seed`),
  logged a line each after `label` and written to TensorBoard's text tab
  under `tag`."""
  gen = config.generate
  samples = sample_text(
    model, params, corpus, gen.num_lines, gen.num_tokens, config.seed, gen.temperature
  )
  for line in samples:
    log.info('%s: %s', label, line)
  metrics.text(tag, '\n\n'.join(samples), step)
  return samples


def score_split(t: Trainer, split: str, params: Any) -> EvalResult:
  """The static score of `params` on `split`: each validation turn's."""
  data = t.config.data
  return evaluate_split(
    t.model, params, t.corpus, split, eval_batch_size(t.config, split), data.bptt, t.eval_step
  )


def final_scores(
  config: ml_collections.ConfigDict,
  workdir: pathlib.Path,
  model: RecurrentLM,
  corpus: Corpus,
  params: Any,
  splits: Sequence[str],
) -> dict[str, EvalResult]:
  """The best weights of the run in `workdir` scored on `splits` by the
  evaluator of `config.evaluation` (static by default), each split at its
  batch size (`eval_batch_size`) unless `evaluation.batch_size` sets one."""
  prepared = {}  # per batch size: what its evaluator tunes or searches, done once
  results = {}
  for split in splits:
    batch_size = final_batch_size(config, split)
    evaluator = workdir_evaluator(workdir, config, config.evaluation, batch_size)
    if batch_size not in prepared:
      prepared[batch_size] = evaluator.prepare(model, params, corpus)
    results[split] = evaluator.score(prepared[batch_size], split)
  return results


def final_batch_size(config: ml_collections.ConfigDict, split: str) -> int:
  """The batch size `split` is scored at in the final evaluation."""
  return config.evaluation.batch_size or eval_batch_size(config, split)


def eval_batch_size(config: ml_collections.ConfigDict, split: str) -> int:
  """The batch size `split` is scored at during and after training."""
  return {'valid': config.data.eval_batch_size, 'test': config.data.test_batch_size}[split]
