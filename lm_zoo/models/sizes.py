"""The sizes a model config implies beyond its own fields."""

from __future__ import annotations

import ml_collections


def embed_size(cfg: ml_collections.ConfigDict, hidden_size: int) -> int:
  """The embedding size: `embed_ratio` x the hidden size when the ratio is
  >= 0 (at most the hidden size, at least 1), else `embed_size`, 0 meaning
  the hidden size."""
  if cfg.embed_ratio >= 0:
    return max(1, round(min(cfg.embed_ratio, 1.0) * hidden_size))
  return cfg.embed_size or hidden_size
