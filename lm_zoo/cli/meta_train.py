r"""Meta-trains the learned weight-update rule (Wolf et al. 2018) for a work
directory's trained model (`lm-zoo-meta-train`, or `python launch/meta_train.py`),
then scores the config's `evaluation.splits` with it:

  lm-zoo-meta-train --workdir=runs/x --config=experiments/dyneval_learned.py \
      --config.meta_steps=300 --config.num_updates=40
  lm-zoo-eval --workdir=runs/x --config=experiments/evaluate.py:learned   # later, again

The rule is saved to WORKDIR/meta_learner, or to --config.output=FOLDER (which
a preset, kept as it was exported, needs). Its progress is saved beside it
(FOLDER.progress) every --config.checkpoint_every meta-steps and on SIGTERM
or SIGINT: the same command resumes a stopped meta-training. Every field of the config can be
set with --config.FIELD=VALUE; they are listed under 'Config fields' below.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.configs import meta_training_config
from lm_zoo.training import evaluate_workdir, meta_train_workdir

config_flags.DEFINE_config_file(
  'config',
  str(cli.EXPERIMENTS / 'dyneval_learned.py'),
  'An experiments/dyneval_learned.py config; override fields with --config.FIELD=VALUE.',
  lock_config=True,
)
flags.DEFINE_string(
  'workdir',
  None,
  'A work directory written by lm-zoo-train, or a preset (its folder, https:// or hf:// URL).',
  required=True,
)
flags.DEFINE_string('data_dir', None, cli.DATA_DIR_HELP)
FLAGS = flags.FLAGS


def _meta_train_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  config = FLAGS.config
  data_dir = cli.run(lambda: cli.workdir_data_dir(FLAGS.workdir, FLAGS.data_dir))
  losses = cli.run(lambda: meta_train_workdir(FLAGS.workdir, config, data_dir))
  if len(losses):
    tenth = max(1, len(losses) // 10)
    print(
      f'meta-training: L_meta / K {losses[:tenth].mean():.4f} over the first '
      f'{tenth} steps, {losses[-tenth:].mean():.4f} over the last {tenth}'
    )
  if config.output and not config.evaluation.learned.meta_learner:
    config.evaluation.learned.meta_learner = config.output  # the rule just trained
  if config.evaluation.splits:
    results = cli.run(lambda: evaluate_workdir(FLAGS.workdir, config.evaluation, data_dir))
    for split, result in results.items():
      print(
        f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
        f'{result.num_tokens:,} tokens; learned update rule)'
      )


def main():
  """The `lm-zoo-meta-train` console script."""
  cli.main(
    sys.modules[__name__],
    _meta_train_program,
    '\nConfig fields (lm_zoo/configs.py: meta_training_config):\n'
    + cli.describe_fields(meta_training_config)
    + '\n',
  )
