"""lm_zoo's version: pyproject.toml reads it, and work directories, checkpoints
and presets record it with their format (`check_format` refuses another)."""

from typing import Any

from lm_zoo.errors import ConfigError

__version__ = '0.2.0'

# The keys of a record lm_zoo writes (config.json, a checkpoint's meta,
# preset.json) that hold the format it was written in and the lm_zoo that wrote it.
FORMAT_KEY, WRITER_KEY = 'format_version', 'lm_zoo_version'


def check_format(
  record: Any, expected: int, what: str, fix: str, error: type[Exception] = ConfigError
) -> dict:
  """`record` (a JSON object of lm_zoo's) without FORMAT_KEY and WRITER_KEY;
  raises `error` unless it holds the format `expected`: the message names
  `what` was read, the lm_zoo and format that wrote it, this one's, and `fix`."""
  fields = record if isinstance(record, dict) else {}
  written = fields.get(FORMAT_KEY)
  if written != expected:
    raise error(
      f'{what} was written by lm_zoo {fields.get(WRITER_KEY, "an earlier version")} (format '
      f'{written}); this is lm_zoo {__version__} (format {expected}), which reads only its '
      f'own: {fix}'
    )
  return {k: v for k, v in fields.items() if k not in (FORMAT_KEY, WRITER_KEY)}
