"""A tiny tuning config file, as a user writes one, for the tuning tests
(test_tuning_study.py, test_tuning_objectives.py, test_tuning_faults.py)."""

import importlib.util
import pathlib

# A tuning config file as a user writes one: 20 steps of a 16-unit LSTM per
# trial, a validation turn every 10, a checkpoint at the end (the tests that
# stop a trial midway checkpoint it more often), learning rate and input
# dropout searched.
TINY_TUNE = """
from lm_zoo.tuning import param, tuning_config

def get_config():
  c = tuning_config()
  c.base.data.update(data_dir={data_dir!r}, train_tokens=2001, valid_tokens=300,
                     test_tokens=100, batch_size=4, bptt=10, eval_batch_size=3)
  c.base.model.update(embed_size=16, hidden_size=16, num_layers=1)
  c.base.optimizer.update(name='adam', learning_rate=3e-3)
  c.base.train.update(num_epochs=10, max_steps=20, eval_every=10, log_every=10,
                     checkpoint_every=20)
  c.base.generate.num_lines = 0
  c.space.learning_rate = param('optimizer.learning_rate', 1e-4, 3e-2, log=True)
  c.space.input_dropout = param('model.dropout_input', 0.0, 0.5)
  c.study.update(name='tiny', num_trials=3, seed=0, startup_trials=2, pruner='none',
                 heartbeat_interval=1, grace_period=60)
  return c
"""


def write_tune_file(folder: pathlib.Path, data_dir) -> pathlib.Path:
  """`TINY_TUNE` reading the data in `data_dir`, written as folder/tune_tiny.py."""
  path = folder / 'tune_tiny.py'
  path.write_text(TINY_TUNE.format(data_dir=str(data_dir)))
  return path


def load_tune_config(path: pathlib.Path):
  """The tuning config of the file at `path`, as lm-zoo-tune reads it."""
  spec = importlib.util.spec_from_file_location('tune_tiny', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
