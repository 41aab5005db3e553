"""Vocabularies: token <-> id maps with encode and decode."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

EOS = '<eos>'
UNK = '<unk>'  # what a capped vocabulary maps the rest of the words to


@dataclasses.dataclass(frozen=True)
class Vocab:
  """An ordered token list; ids are positions in it.

  Attributes:
    tokens: the tokens, id order.
    kind: 'word' (decode joins with spaces), 'char' (PTB-char: '_' is a space)
      or 'byte' (ids are byte values' ranks; decode gives UTF-8 text).
  """

  tokens: tuple[str, ...]
  kind: str = 'word'

  def __post_init__(self):
    object.__setattr__(self, '_index', {t: i for i, t in enumerate(self.tokens)})

  @property
  def unit(self) -> str:
    """What a token is scored as: 'word' (perplexity), else 'char' (bits per
    character, a byte's too)."""
    return 'word' if self.kind == 'word' else 'char'

  def __len__(self) -> int:
    return len(self.tokens)

  def __contains__(self, token: str) -> bool:
    return token in self._index

  def id(self, token: str) -> int:
    return self._index[token]

  def encode(self, tokens: Iterable[str]) -> np.ndarray:
    """Maps tokens to ids; a token outside the vocabulary raises KeyError."""
    index = self._index
    return np.fromiter((index[t] for t in tokens), dtype=np.int32)

  def tokenize(self, text: str) -> list[str]:
    """Raw text as tokens, the way the corpus files are tokenised."""
    if self.kind == 'word':
      return text.split()
    if self.kind == 'char':
      return ['_' if ch == ' ' else ch for ch in text]
    return [chr(b) for b in text.encode('utf-8')]

  def unknown(self, text: str) -> list[str]:
    """The tokens of `text` (as `tokenize` reads it) outside the vocabulary."""
    return [token for token in self.tokenize(text) if token not in self._index]

  def encode_text(self, text: str) -> np.ndarray:
    """Encodes raw text the way the corpus files are tokenised."""
    return self.encode(self.tokenize(text))

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    tokens = [self.tokens[int(i)] for i in np.asarray(ids).reshape(-1)]
    if self.kind == 'word':
      lines, line = [], []
      for t in tokens:
        if t == EOS:
          lines.append(' '.join(line))
          line = []
        else:
          line.append(t)
      return '\n'.join(lines + [' '.join(line)])
    if self.kind == 'char':
      return ''.join('\n' if t == EOS else ' ' if t == '_' else t for t in tokens)
    return bytes(ord(t) for t in tokens).decode('utf-8', errors='replace')
