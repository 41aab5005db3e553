"""Runs an experiment of `lm_zoo.tasks` (reverse copy, tail regression, MNIST,
the robustness study, seed studies), prints its result table (and a seed
study's summary) and writes the rows as JSON (`lm-zoo-task`, or
`python launch/run_task.py`):

  lm-zoo-task --config=experiments/tail_regression.py --output=runs/tail_regression.json
"""

import json
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.errors import ConfigError
from lm_zoo.tasks import REPORTS, TASKS

config_flags.DEFINE_config_file(
  'config',
  None,
  'An experiments/*.py config with a `task` field; override fields with --config.field=v.',
  lock_config=True,
)
flags.DEFINE_string('output', None, 'JSON file for the result rows.')
flags.mark_flags_as_required(['config', 'output'])
FLAGS = flags.FLAGS


def run_task() -> list[dict]:
  task = FLAGS.config.get('task')
  if task not in TASKS:
    raise ConfigError(f'config.task is {task!r}: choose one of {", ".join(TASKS)}')
  return TASKS[task](FLAGS.config)


def result_table(rows: list[dict]) -> str:
  """The rows' scalar columns (every row's, in order of appearance), one
  line a row under a header; '-' where a row has none."""
  columns = list(
    dict.fromkeys(k for row in rows for k, v in row.items() if isinstance(v, (int, float, str)))
  )

  def cell(row, column):
    value = row.get(column, '-')
    return f'{value:>16.4f}' if isinstance(value, float) else f'{value!s:>16}'

  lines = ['  '.join(f'{c:>16}' for c in columns)]
  lines += ['  '.join(cell(row, c) for c in columns) for row in rows]
  return '\n'.join(lines)


def _task_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  cli.with_env_data_dir(FLAGS.config)
  path = pathlib.Path(FLAGS.output)
  cli.run(lambda: cli.check_output(path))  # before the experiment's minutes
  rows = cli.run(run_task)
  print(result_table(rows))
  if FLAGS.config.task in REPORTS:
    print()
    print(REPORTS[FLAGS.config.task](rows, FLAGS.config))
  path.write_text(json.dumps(rows, indent=2))


def main():
  """The `lm-zoo-task` console script."""
  cli.main(sys.modules[__name__], _task_program)
