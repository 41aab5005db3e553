"""A run's operational parts, beside the training loop that uses them: its
work directory (`workdir`: named, locked, its config and data recorded),
checkpoints and their integrity (`checkpoints`), metrics (`metrics`), the
stop request of SIGTERM or Ctrl-C (`preemption`), the non-finite policy
(`nonfinite`), and a finished run read back (`finished`) or exported as a
preset (`export`)."""

from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.runs.export import export
from lm_zoo.runs.finished import load_config, load_model, load_trained
from lm_zoo.runs.metrics import MetricsWriter, read_metrics

__all__ = [
  'Checkpoints',
  'MetricsWriter',
  'export',
  'load_config',
  'load_model',
  'load_trained',
  'read_metrics',
]
