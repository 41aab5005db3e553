"""Runs an experiment of `lm_zoo.tasks` (reverse copy, tail regression, MNIST,
the robustness study, seed studies), prints its result table (and a seed
study's summary) and writes the rows as JSON:

  python launch/run_task.py --config=experiments/tail_regression.py \
      --output=runs/tail_regression.json
"""

import json
import pathlib

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.errors import ConfigError
from lm_zoo.tasks import REPORTS, TASKS

config_flags.DEFINE_config_file('config', None, 'An experiments/*.py config with a '
                                '`task` field; override fields with --config.field=v.',
                                lock_config=True)
flags.DEFINE_string('output', None, 'JSON file for the result rows.')
flags.mark_flags_as_required(['config', 'output'])
FLAGS = flags.FLAGS


def run() -> list[dict]:
  task = FLAGS.config.get('task')
  if task not in TASKS:
    raise ConfigError(f'config.task is {task!r}: choose one of {", ".join(TASKS)}')
  return TASKS[task](FLAGS.config)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  rows = cli.run(run)
  columns = [k for k, v in rows[0].items() if not isinstance(v, list)]
  print('  '.join(f'{c:>16}' for c in columns))
  for row in rows:
    print('  '.join(f'{row[c]:>16.4f}' if isinstance(row[c], float) else f'{row[c]:>16}'
                    for c in columns))
  if FLAGS.config.task in REPORTS:
    print()
    print(REPORTS[FLAGS.config.task](rows, FLAGS.config))
  path = pathlib.Path(FLAGS.output)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(rows, indent=2))


if __name__ == '__main__':
  app.run(main)
