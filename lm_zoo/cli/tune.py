r"""Tunes hyper-parameters with Optuna (`lm-zoo-tune`, or `python launch/tune.py`):
each trial is a real training run in WORKDIR/trials/STUDY/trial_NNNN (or a dynamic
evaluation of a trained model), the study lives in a database, and a report
of the best trials with a parallel-coordinates plot of the best one's
neighbourhood is written to WORKDIR/report.md and parallel_coordinates.png.

  lm-zoo-tune --tune=experiments/tune_ptb_small.py:mogrifier --workdir=runs/tune_mog
  lm-zoo-tune --tune=experiments/tune_dyneval.py --tune.dyneval.workdir=runs/x \
      --workdir=runs/x/tune_dyneval
  lm-zoo-tune --tune=... --workdir=... --report_only   # the report of the study so far

Several workers, on one machine or many, share a study through its database
(SQLite in WORKDIR by default; PostgreSQL or MySQL across hosts):

  lm-zoo-tune --tune=experiments/tune_mogrifier.py:mogrifier --workdir=/shared/tune_mog \
      --tune.study.storage=postgresql://USER:PASSWORD@HOST/DB --worker=K

The study stops at --tune.study.num_trials finished trials over all workers.
A worker that dies leaves its trial running until the heartbeat is
tune.study.grace_period seconds old; then the next worker to start a trial
marks it failed and queues it again, and the retry resumes from its
checkpoints. Run the same command to resume a stopped study.
"""

import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.errors import ConfigError

config_flags.DEFINE_config_file(
  'tune',
  str(cli.EXPERIMENTS / 'tune_ptb_small.py'),
  'An experiments/tune_*.py '
  'tuning config; override fields with --tune.SECTION.FIELD=VALUE (the search '
  'space too: --tune.space.learning_rate.high=0.01).',
  lock_config=True,
)
flags.DEFINE_string(
  'workdir',
  'runs/tune',
  'Where the trials, the SQLite study '
  '(unless --tune.study.storage names a database) and the report go.',
)
flags.DEFINE_integer(
  'worker',
  0,
  "This worker's number, added to a seeded sampler's seed so that workers sample differently.",
  lower_bound=0,
)
flags.DEFINE_float('timeout', 0, '> 0: start no trial after this many seconds.')
flags.DEFINE_bool('report_only', False, 'Write the report of the study so far; run no trial.')
flags.DEFINE_string('data_dir', None, 'A dyneval study: ' + cli.DATA_DIR_HELP)
FLAGS = flags.FLAGS


def _tune_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')

  def tune() -> str:
    from lm_zoo.tuning import open_study, run_worker, write_report  # needs the [tune] extra
    from lm_zoo.tuning.study import validate_tuning

    if not FLAGS.workdir.strip():  # '' would be the current folder
      raise ConfigError('--workdir is empty: name a folder for the study (--workdir=runs/NAME)')
    if pathlib.Path(FLAGS.workdir).is_file():
      raise ConfigError(
        f'--workdir={FLAGS.workdir} is a file, not a folder: name a folder for the study'
      )
    tune, data_dir = FLAGS.tune, None
    validate_tuning(tune)  # before its fields are read here
    if tune.kind == 'dyneval':
      data_dir = cli.workdir_data_dir(tune.dyneval.workdir, FLAGS.data_dir)
    else:  # as the study recorded its base config: a report opens the same study
      cli.with_env_data_dir(tune.base)
    if FLAGS.report_only:
      study = open_study(tune, FLAGS.workdir, FLAGS.worker)
    else:
      study = run_worker(tune, FLAGS.workdir, FLAGS.worker, FLAGS.timeout, data_dir)
    return write_report(study, tune, FLAGS.workdir)

  print(cli.run(tune))


def main():
  """The `lm-zoo-tune` console script."""
  cli.main(sys.modules[__name__], _tune_program)
