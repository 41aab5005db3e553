"""Text from a recurrent language model: multinomial sampling with a
temperature and top-k, greedy decoding and beam search (docs/models.md §9).

Every decoder reads its prompt with dropout off, then feeds its own tokens
back one step at a time inside one jitted `lax.scan`. Sampling is
reproducible: the same `rng` gives the same text.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_zoo.data.vocab import EOS, UNK, Vocab
from lm_zoo.evaluation.checks import check_temperature
from lm_zoo.models import RecurrentLM
from lm_zoo.models.objective import check_token_ids


class UnknownTokensWarning(UserWarning):
  """A prompt holds tokens outside the vocabulary, which read as `<unk>`."""


def _check_prompt(prompt, vocab_size: int) -> jax.Array:
  check_token_ids(prompt, vocab_size, 'prompt')
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] == 0:
    raise ValueError(f'prompt must be (batch, length>0) ids, got {prompt.shape}')
  return prompt


def _read_prompt(model: RecurrentLM, params, prompt):
  """The next-token logits after each prompt row (B, V), and the carries."""
  logits, carries = model.apply({'params': params}, prompt, model.initialize_carry(prompt.shape[0]))
  return logits[:, -1], carries


def _next(model: RecurrentLM, params, tokens, carries):
  logits, carries = model.apply({'params': params}, tokens[:, None], carries)
  return logits[:, -1], carries


def top_k_logits(logits: jax.Array, k: int) -> jax.Array:
  """`logits` with all but the k largest of each row set to -inf (k = 0: all
  kept); of tokens tied at the k-th largest, the lowest ids are kept."""
  if k <= 0 or k >= logits.shape[-1]:
    return logits
  largest, ids = jax.lax.top_k(logits, k)
  return jnp.put_along_axis(jnp.full_like(logits, -jnp.inf), ids, largest, axis=-1, inplace=False)


@functools.partial(jax.jit, static_argnames=('model', 'num_tokens', 'top_k'))
def _sample(model: RecurrentLM, params, prompt, rng, temperature, num_tokens, top_k):
  def step(state, key):
    logits, carries = state
    token = jax.random.categorical(key, top_k_logits(logits / temperature, top_k))
    return _next(model, params, token, carries), token

  keys = jax.random.split(rng, num_tokens)
  _, tokens = jax.lax.scan(step, _read_prompt(model, params, prompt), keys)
  return tokens.T


def sample(
  model: RecurrentLM,
  params: Any,
  prompt: np.ndarray,
  num_tokens: int,
  rng: jax.Array,
  temperature: float = 1.0,
  top_k: int = 0,
) -> np.ndarray:
  """Multinomial sampling: `num_tokens` ids after each row of `prompt` (B, P).

  Each next token is drawn from softmax(logits / temperature), restricted to
  the `top_k` most likely tokens when `top_k` > 0.
  """
  check_temperature(temperature)
  _count('num_tokens', num_tokens, 0)
  _count('top_k', top_k, 0)
  return np.asarray(
    _sample(
      model,
      params,
      _check_prompt(prompt, model.vocab_size),
      rng,
      jnp.float32(temperature),
      num_tokens,
      top_k,
    )
  )


@functools.partial(jax.jit, static_argnames=('model', 'num_tokens'))
def _greedy(model: RecurrentLM, params, prompt, num_tokens):
  def step(state, _):
    logits, carries = state
    token = jnp.argmax(logits, axis=-1)
    return _next(model, params, token, carries), token

  _, tokens = jax.lax.scan(step, _read_prompt(model, params, prompt), None, length=num_tokens)
  return tokens.T


def greedy(model: RecurrentLM, params: Any, prompt: np.ndarray, num_tokens: int) -> np.ndarray:
  """Greedy decoding: the most likely next token, `num_tokens` times per row."""
  prompt = _check_prompt(prompt, model.vocab_size)
  _count('num_tokens', num_tokens, 0)
  return np.asarray(_greedy(model, params, prompt, num_tokens))


@functools.partial(jax.jit, static_argnames=('model', 'num_tokens', 'beam_width', 'eos_id'))
def _beam_search(model: RecurrentLM, params, prompt, num_tokens, beam_width, eos_id):
  logits, carries = _read_prompt(model, params, prompt)  # batch 1
  width = beam_width
  repeat = lambda tree: jax.tree.map(lambda a: jnp.repeat(a, width, axis=0), tree)
  logits, carries = repeat(logits), repeat(carries)
  # One live beam at first, so the first expansion has no duplicates.
  scores = jnp.full((width,), -jnp.inf).at[0].set(0.0)
  history = jnp.zeros((width, num_tokens), jnp.int32)
  finished = jnp.zeros((width,), bool)
  vocab = logits.shape[-1]

  def step(state, t):
    logits, carries, scores, history, finished = state
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    if eos_id is not None:  # a finished beam continues with eos at no cost
      only_eos = jnp.full((vocab,), -jnp.inf).at[eos_id].set(0.0)
      log_probs = jnp.where(finished[:, None], only_eos, log_probs)
    candidates = (scores[:, None] + log_probs).reshape(-1)
    scores, index = jax.lax.top_k(candidates, width)
    parent, token = index // vocab, (index % vocab).astype(jnp.int32)
    history = history[parent].at[:, t].set(token)
    finished = finished[parent]
    if eos_id is not None:
      finished = finished | (token == eos_id)
    carries = jax.tree.map(lambda a: a[parent], carries)
    logits, carries = _next(model, params, token, carries)
    return (logits, carries, scores, history, finished), None

  state = (logits, carries, scores, history, finished)
  (_, _, scores, history, _), _ = jax.lax.scan(step, state, jnp.arange(num_tokens))
  best = jnp.argmax(scores)
  return history[best], scores[best]


def beam_search(
  model: RecurrentLM,
  params: Any,
  prompt: np.ndarray,
  num_tokens: int,
  beam_width: int,
  eos_id: int | None = None,
) -> tuple[np.ndarray, float]:
  """The most likely continuation of one prompt found by beam search.

  Keeps the `beam_width` best partial sequences by total log-probability (no
  length normalisation). With `eos_id`, a beam that emits it is finished: it
  keeps its score and is padded with `eos_id` to `num_tokens`.

  Args:
    prompt: ids (P,) or (1, P).
  Returns:
    (the `num_tokens` ids, their total log-probability given the prompt).
  """
  if np.ndim(prompt) not in (1, 2) or np.ndim(prompt) == 2 and np.shape(prompt)[0] != 1:
    raise ValueError(f'prompt must be one row of ids, (P,) or (1, P), got {np.shape(prompt)}')
  prompt = _check_prompt(np.reshape(prompt, (1, -1)), model.vocab_size)
  _count('num_tokens', num_tokens, 0)
  _count('beam_width', beam_width, 1, model.vocab_size)
  tokens, score = _beam_search(model, params, prompt, num_tokens, beam_width, eos_id)
  return np.asarray(tokens), float(score)


def start_id(vocab: Vocab) -> int:
  """The token a text starts after: the end of sentence, else id 0."""
  return vocab.id(EOS) if EOS in vocab else 0


def encode_prompt(vocab: Vocab, text: str) -> np.ndarray:
  """The prompt's ids, after the start token (`start_id`): generation from
  scratch when `text` is empty. A word outside the vocabulary becomes
  `<unk>` where the vocabulary has it."""
  ids = [start_id(vocab)]
  for token in vocab.tokenize(text):
    if token not in vocab:
      if UNK not in vocab:
        raise ValueError(f'{token!r} is not in the vocabulary, which has no {UNK}')
      token = UNK
    ids.append(vocab.id(token))
  return np.asarray(ids, np.int32)


# The most tokens one call generates: longer ones run for minutes with no output.
MAX_NEW_TOKENS = 10_000


def _count(name: str, value: Any, low: int, high: int | None = None) -> None:
  """A ValueError naming `name` unless `value` is an int in [low, high]."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f'{name} must be a whole number, got {value!r}')
  if value < low or (high is not None and value > high):
    bound = f'from {low} to {high:,}' if high is not None else f'at least {low}'
    raise ValueError(f'{name} must be {bound}, got {value:,}')


def check_generation(
  prompt: Any, num_tokens: Any, num_samples: Any, seed: Any, beam_width: Any
) -> None:
  """A one-line ValueError naming the first argument of `generate_text`
  that is out of its range (temperature and top_k are `sample`'s)."""
  if not isinstance(prompt, str):
    raise ValueError(f'prompt must be text (a str), got {type(prompt).__name__}')
  _count('num_tokens', num_tokens, 1, MAX_NEW_TOKENS)
  _count('num_samples', num_samples, 1, 1024)
  _count('seed', seed, 0, 2**32 - 1)
  _count('beam_width', beam_width, 0)


def generate_text(
  model: RecurrentLM,
  params: Any,
  vocab: Vocab,
  prompt: str = '',
  num_tokens: int = 30,
  num_samples: int = 1,
  seed: int = 0,
  temperature: float = 1.0,
  top_k: int = 0,
  beam_width: int = 0,
) -> list[str]:
  """Continuations of `prompt` (text) as text: `num_samples` samples, or with
  `beam_width` > 1 the one beam-search continuation (ended at an end of
  sentence where the vocabulary has one).

  Raises:
    ValueError: an argument out of its range (`check_generation`), a word
      the vocabulary lacks and cannot map to <unk>.
  """
  check_generation(prompt, num_tokens, num_samples, seed, beam_width)
  ids = encode_prompt(vocab, prompt)
  unknown = vocab.unknown(prompt)
  if unknown:
    warnings.warn(
      f'the prompt has {len(unknown)} token(s) outside the vocabulary, read as '
      f'{UNK}: {", ".join(map(repr, unknown[:5]))}'
      f'{" ..." if len(unknown) > 5 else ""}',
      UnknownTokensWarning,
      stacklevel=2,
    )
  if beam_width > 1:
    eos_id = vocab.id(EOS) if EOS in vocab else None
    tokens, _ = beam_search(model, params, ids, num_tokens, beam_width, eos_id)
    ended = np.flatnonzero(tokens == eos_id)
    rows = [tokens[: ended[0]] if ended.size else tokens]  # the sentence, not its padding
  else:
    rows = sample(
      model,
      params,
      np.tile(ids, (num_samples, 1)),
      num_tokens,
      jax.random.key(seed),
      temperature,
      top_k,
    )
  return [vocab.decode(np.concatenate([ids[1:], row])) for row in rows]
