r"""Trains a language model (`lm-zoo-train`, or `python launch/train.py` in a checkout):

  lm-zoo-train --config=experiments/ptb_lstm_small.py --workdir=runs/small
  lm-zoo-train --config=experiments/mogrifier_paper.py:ptb_mogrifier \
      --config.model.param_budget=10000000

Re-running the same command resumes from the work directory's latest checkpoint.
`--seeds=N` (N > 1) trains seeds config.seed, ..., config.seed + N - 1 at
once, each one's run in WORKDIR/seed_S and their mean and spread in
WORKDIR/summary.json (lm_zoo.training.seed_axis; docs/usage.md).
`--config.parallel.num_devices=0` trains data-parallel over every device;
LM_ZOO_DISTRIBUTED=1 joins a multi-host job first (lm_zoo.training.parallel).
Every config field can be set with --config.SECTION.FIELD=VALUE; they are
listed under 'Config fields' below.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.training import initialize_distributed, train_and_evaluate

config_flags.DEFINE_config_file(
  'config',
  str(cli.EXPERIMENTS / 'default.py'),
  'An experiments/*.py config file; override fields with --config.SECTION.FIELD=VALUE.',
  lock_config=True,
)
flags.DEFINE_string(
  'workdir',
  'runs/default',
  'Where checkpoints, metrics.jsonl, TensorBoard events, config.json and summary.json are written.',
)
flags.DEFINE_integer(
  'seeds',
  0,
  'N > 1: train N seeds of the config at once (seeds '
  'config.seed to config.seed + N - 1; each run in WORKDIR/seed_S, their '
  'mean and spread in WORKDIR/summary.json). 0 or 1: one run.',
  lower_bound=0,
)
FLAGS = flags.FLAGS


def _train_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')

  def train():
    initialize_distributed()  # multi-host only when $LM_ZOO_DISTRIBUTED=1
    cli.with_env_data_dir(FLAGS.config)
    train_and_evaluate(
      FLAGS.config, FLAGS.workdir, num_seeds=max(FLAGS.seeds, 1), command=cli.command_line()
    )

  cli.run(train)


def main():
  """The `lm-zoo-train` console script."""
  cli.main(
    sys.modules[__name__],
    _train_program,
    '\nConfig fields (defaults of lm_zoo/configs.py; experiments change some):\n'
    + cli.describe_fields()
    + '\n',
  )
