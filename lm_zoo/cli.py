"""Shared set-up for the launch scripts."""

import logging

from absl import logging as absl_logging


def show_progress() -> None:
  """lm_zoo's INFO lines on the console; libraries' (orbax's) only from WARNING."""
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger('lm_zoo').setLevel(logging.INFO)
