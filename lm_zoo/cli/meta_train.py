r"""Meta-trains the learned weight-update rule (Wolf et al. 2018) for a work
directory's trained model (`lm-zoo-meta-train`, or `python launch/meta_train.py`),
then scores the config's `evaluation.splits` with it:

  lm-zoo-meta-train --workdir=runs/x --config=experiments/dyneval_learned.py \
      --config.meta_steps=300 --config.num_updates=40
  lm-zoo-eval --workdir=runs/x --config=experiments/evaluate.py:learned   # later, again

The rule is saved to WORKDIR/meta_learner, or to --config.output=FOLDER (which
a preset, kept as it was exported, needs). Its progress is saved inside that
folder (FOLDER/progress) every --config.checkpoint_every meta-steps and on
SIGTERM or SIGINT, the scores after it in WORKDIR/evaluations/progress: the
same command resumes a stopped run where it stopped (a finished rule is not
meta-trained again). Every field of the config can be
set with --config.FIELD=VALUE; they are listed under 'Config fields' below.
"""

import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.configs import meta_training_config
from lm_zoo.errors import ConfigError
from lm_zoo.presets import is_preset
from lm_zoo.remote import resolve
from lm_zoo.runs.files import EVALUATIONS_DIR
from lm_zoo.runs.workdir import refuse_links
from lm_zoo.training import evaluate_workdir, meta_train_workdir
from lm_zoo.training.evaluation_progress import PROGRESS_DIR

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
    progress = cli.run(lambda: _progress_folder(FLAGS.workdir))
    evaluation = config.evaluation
    results = cli.run(lambda: evaluate_workdir(FLAGS.workdir, evaluation, data_dir, progress))
    for split, result in results.items():
      print(
        f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
        f'{result.num_tokens:,} tokens; learned update rule)'
      )


def _progress_folder(workdir: str) -> pathlib.Path | None:
  """Where the scores after meta-training are kept, so that a stopped
  evaluation resumes: the work directory's, not a preset's nor through a link."""
  workdir = resolve(workdir)
  if not workdir.is_dir() or is_preset(workdir):
    return None
  try:
    refuse_links(workdir)
  except ConfigError:
    return None
  return workdir / EVALUATIONS_DIR / PROGRESS_DIR


def main():
  """The `lm-zoo-meta-train` console script."""
  cli.main(
    sys.modules[__name__],
    _meta_train_program,
    '\nConfig fields (lm_zoo/configs.py: meta_training_config):\n'
    + cli.describe_fields(meta_training_config)
    + '\n',
  )
