"""Trains a language model: `python launch/train.py --config=experiments/default.py --workdir=runs/x`.

Re-running the same command resumes from the work directory's latest checkpoint.
`--config.parallel.num_devices=0` trains data-parallel over every device;
LM_ZOO_DISTRIBUTED=1 joins a multi-host job first (lm_zoo.training.parallel).
"""

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.training import initialize_distributed, train_and_evaluate

config_flags.DEFINE_config_file(
    'config', 'experiments/default.py', 'An experiments/*.py config file; '
    'override fields with --config.section.field=value.', lock_config=True)
flags.DEFINE_string('workdir', 'runs/default', 'Where checkpoints, metrics.jsonl, '
                    'config.json and summary.json are written.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  initialize_distributed()  # multi-host only when $LM_ZOO_DISTRIBUTED=1
  cli.run(lambda: train_and_evaluate(FLAGS.config, FLAGS.workdir))


if __name__ == '__main__':
  app.run(main)
