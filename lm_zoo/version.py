"""lm_zoo's version: pyproject.toml reads it, and work directories, checkpoints
and presets record it."""

__version__ = '0.2.0'
