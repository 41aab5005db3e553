"""How a run scores and samples a model: `evaluate_split` and `sample_text`,
and `score_split`, the one function the training loop scores with (each
validation turn and the final evaluation)."""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from lm_zoo import generation
from lm_zoo.data import Corpus
from lm_zoo.models import RecurrentLM
from lm_zoo.training.evaluation import EvalResult, evaluate_stream
from lm_zoo.training.run import Trainer
from lm_zoo.training.steps import make_eval_step


def evaluate_split(model: RecurrentLM, params: Any, corpus: Corpus, split: str,
                   batch_size: int, bptt: int, eval_step=None) -> EvalResult:
  """Perplexity / bits per character of one split, state carried throughout."""
  eval_step = eval_step or make_eval_step(model)
  return evaluate_stream(eval_step, params, model.initialize_carry(batch_size),
                         corpus.split(split), batch_size, bptt, corpus.unit,
                         what=f'{split} evaluation')


def sample_text(model: RecurrentLM, params: Any, corpus: Corpus, num_lines: int,
                num_tokens: int, seed: int, temperature: float) -> list[str]:
  """`num_lines` samples, each started after an end of sentence."""
  prompt = np.full((num_lines, 1), generation.start_id(corpus.vocab), np.int32)
  ids = generation.sample(model, params, prompt, num_tokens, jax.random.key(seed),
                          temperature)
  return [corpus.vocab.decode(row).strip().replace('\n', ' | ') for row in ids]


def score_split(t: Trainer, split: str, params: Any) -> EvalResult:
  """The score of `params` on `split`: each validation turn's and the final ones."""
  data = t.config.data
  return evaluate_split(t.model, params, t.corpus, split, eval_batch_size(t.config, split),
                        data.bptt, t.eval_step)


def eval_batch_size(config: ml_collections.ConfigDict, split: str) -> int:
  """The batch size `split` is scored at during and after training."""
  return {'valid': config.data.eval_batch_size, 'test': config.data.test_batch_size}[split]
