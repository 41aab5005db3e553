"""Reverse copy: cross-entropy against sequence length for LSTM and Mogrifier.

  python launch/reverse_copy.py --config=experiments/reverse_copy.py --output=runs/reverse_copy.json
"""

import json
import pathlib

from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.tasks import run_experiment

config_flags.DEFINE_config_file('config', 'experiments/reverse_copy.py',
                                'The experiment config.', lock_config=True)
flags.DEFINE_string('output', 'runs/reverse_copy.json', 'JSON results file.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  rows = cli.run(lambda: run_experiment(FLAGS.config))
  print(f'{"length":>6} {"model":>10} {"cross-entropy":>13} {"accuracy":>8}')
  for r in rows:
    print(f'{r["length"]:>6} {r["model"]:>10} {r["cross_entropy"]:>13.4f} '
          f'{r["accuracy"]:>8.4f}')
  path = pathlib.Path(FLAGS.output)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(rows, indent=2))


if __name__ == '__main__':
  app.run(main)
