"""Trains a language model (`lm-zoo-train`, or `python launch/train.py` in a checkout):

  lm-zoo-train --config=experiments/ptb_lstm_small.py --workdir=runs/small
  lm-zoo-train --config=experiments/mogrifier_paper.py:ptb_mogrifier \
      --config.model.param_budget=10000000

Re-running the same command resumes from the work directory's latest checkpoint.
`--seeds=N` trains seeds config.seed, ..., config.seed + N - 1 at once on one
device, each one's run in WORKDIR/seed_S and their mean and spread in
WORKDIR/summary.json (lm_zoo.training.stacked; docs/usage.md).
`--config.parallel.num_devices=0` trains data-parallel over every device;
LM_ZOO_DISTRIBUTED=1 joins a multi-host job first (lm_zoo.training.parallel).
Every config field can be set with --config.SECTION.FIELD=VALUE; they are
listed under 'Config fields' below.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.errors import ConfigError
from lm_zoo.training import initialize_distributed, train_and_evaluate, train_seeds
from lm_zoo.training.parallel import DISTRIBUTED_ENV, distributed_requested

config_flags.DEFINE_config_file(
    'config', str(cli.EXPERIMENTS / 'default.py'), 'An experiments/*.py config file; '
    'override fields with --config.SECTION.FIELD=VALUE.', lock_config=True)
flags.DEFINE_string('workdir', 'runs/default', 'Where checkpoints, metrics.jsonl, '
                    'TensorBoard events, config.json and summary.json are written.')
flags.DEFINE_integer('seeds', 0, 'N > 0: train N seeds of the config at once, stacked on one '
                     'device (seeds config.seed to config.seed + N - 1; each run in '
                     'WORKDIR/seed_S, their mean and spread in WORKDIR/summary.json). 0: '
                     'one run.', lower_bound=0)
FLAGS = flags.FLAGS


def _train_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')

  def train():
    if FLAGS.seeds:
      if distributed_requested():
        raise ConfigError(f'--seeds trains a stack on one device: unset {DISTRIBUTED_ENV} '
                          '(many hosts would each train the whole stack in one work '
                          'directory), or train without --seeds')
      cli.with_env_data_dir(FLAGS.config)
      train_seeds(FLAGS.config, FLAGS.workdir, FLAGS.seeds)
      return
    initialize_distributed()  # multi-host only when $LM_ZOO_DISTRIBUTED=1
    cli.with_env_data_dir(FLAGS.config)
    train_and_evaluate(FLAGS.config, FLAGS.workdir)

  cli.run(train)


def main():
  """The `lm-zoo-train` console script."""
  cli.main(sys.modules[__name__], _train_program,
           '\nConfig fields (defaults of lm_zoo/configs.py; experiments change some):\n'
           + cli.describe_fields() + '\n')
