"""A trained model from its work directory, without its training data
(`lm_zoo.load(workdir)`): it scores text, gives each token's loss,
generates from a prompt, and runs dynamic evaluation along a text.

  model = lm_zoo.load('runs/small')  # or a preset: its folder, https:// or hf:// URL
  model.score('the company said it expects higher sales').perplexity
  model.generate('the company said', num_tokens=20, num_samples=3)
  model.dynamic_evaluate(long_text, learning_rate=0.01).details['static_loss']

(`long_text`: any text, a few hundred words or more.)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from lm_zoo import generation
from lm_zoo.data import EOS, Vocab
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import EvalResult, dynamic_evaluate, evaluate_stream, make_eval_step
from lm_zoo.evaluation import token_losses as stream_token_losses
from lm_zoo.models import RecurrentLM
from lm_zoo.optim import dynamic_sgd
from lm_zoo.remote import resolve
from lm_zoo.runs.finished import load_model


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """A work directory's model with its best weights and vocabulary.

  Text is tokenised as the corpus files were (`Vocab.tokenize`), each line
  ending in an end of sentence where the vocabulary has one, and scored
  after an end of sentence: as a sentence of the corpus is. A word outside
  the vocabulary is `<unk>` where the vocabulary has it, else an error.

  Attributes:
    config: the run's config.
    vocab: its vocabulary.
    model: the language model.
    params: the best parameters.
    workdir: where they were read from.
  """

  config: ml_collections.ConfigDict
  vocab: Vocab
  model: RecurrentLM
  params: Any
  workdir: pathlib.Path

  @property
  def unit(self) -> str:
    return self.vocab.unit

  def encode(self, text: str) -> np.ndarray:
    """The ids of `text`, after the start token (`generation.start_id`);
    each line ends in an end of sentence where the vocabulary has one (a
    byte vocabulary reads the newlines as bytes)."""
    if EOS not in self.vocab:
      return generation.encode_prompt(self.vocab, text)
    eos = self.vocab.id(EOS)
    lines = [
      np.append(generation.encode_prompt(self.vocab, line)[1:], eos) for line in text.splitlines()
    ]
    return np.concatenate([[eos], *lines]).astype(np.int32)

  def score(self, text: str) -> EvalResult:
    """Perplexity (or bits per character) of `text`, dropout off. Its
    details count the tokens read as `<unk>` (`unknown_tokens`): a text
    full of them scores the vocabulary, not the text.

    Raises:
      ValueError: `text` is not a str, or holds no token to score.
    """
    ids = self._scored(text)
    result = evaluate_stream(
      make_eval_step(self.model),
      self.params,
      self.model.initialize_carry(1),
      ids,
      1,
      self.config.data.bptt,
      self.unit,
    )
    return dataclasses.replace(
      result, details={**result.details, 'unknown_tokens': len(self.vocab.unknown(text))}
    )

  def token_losses(self, text: str) -> tuple[list[str], np.ndarray]:
    """Each token of `text` and its loss in nats given every token before it."""
    ids = self._scored(text)
    losses = stream_token_losses(self.model, self.params, ids, self.config.data.bptt)
    return [self.vocab.tokens[i] for i in ids[1:]], losses

  def _scored(self, text: Any) -> np.ndarray:
    """`encode(text)`, once `text` is text with a word (or character) in it."""
    if not isinstance(text, str):
      hint = ": decode it first, text.decode('utf-8')" if isinstance(text, bytes) else ''
      raise ValueError(f'text must be a str, got {type(text).__name__}{hint}')
    if not (text.strip() if self.vocab.kind == 'word' else text):
      raise ValueError(
        f'text has no {"word" if self.vocab.kind == "word" else "character"} '
        'to score: give it at least one'
      )
    return self.encode(text)

  def generate(
    self,
    prompt: str = '',
    num_tokens: int = 30,
    num_samples: int = 1,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    beam_width: int = 0,
  ) -> list[str]:
    """Continuations of `prompt` (`generation.generate_text`)."""
    return generation.generate_text(
      self.model,
      self.params,
      self.vocab,
      prompt,
      num_tokens,
      num_samples,
      seed,
      temperature,
      top_k,
      beam_width,
    )

  def dynamic_evaluate(
    self,
    text: str,
    learning_rate: float = 1e-2,
    decay: float = 0.0,
    segment_length: int = 5,
    transformation: optax.GradientTransformation | None = None,
  ) -> EvalResult:
    """`text` scored with dynamic evaluation from the trained weights: each
    segment of `segment_length` tokens scored, then a step on it, by SGD
    with `learning_rate` and `decay` toward the trained weights, or by
    `transformation` (any of lm_zoo.optim's, `dynamic_rms` with its MS
    included). The result's details hold the static loss of the same tokens
    and the adapted weights."""
    ids = self._scored(text)
    run = dynamic_evaluate(
      self.model,
      self.params,
      transformation or dynamic_sgd(learning_rate, decay),
      ids,
      segment_length,
      1,
      self.unit,
    )
    static = self.score(text)
    return dataclasses.replace(
      run.result,
      details={
        'static_loss': static.loss,
        'segment_nll': run.segment_nll,
        'segment_tokens': run.segment_tokens,
        'skipped_updates': run.skipped_updates,
        'params': run.params,
      },
    )


def load(workdir: str | pathlib.Path) -> TrainedModel:
  """The model a work directory holds, with its best weights and its
  vocabulary, ready to use without the data it was trained on. `workdir`
  may also be a preset folder (`lm-zoo-export`), an https:// URL of one
  (downloaded once into $LM_ZOO_CACHE) or hf://OWNER/NAME[@REVISION]
  (`lm_zoo.remote`)."""
  if not isinstance(workdir, (str, os.PathLike)) or not str(workdir):
    raise ConfigError(
      f'workdir must name a work directory written by lm-zoo-train, a '
      f'preset or its URL, got {workdir!r}'
    )
  workdir = resolve(workdir)
  config, vocab, model, params = load_model(workdir)
  return TrainedModel(config, vocab, model, jax.device_put(params), workdir)
