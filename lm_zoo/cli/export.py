"""Writes a work directory's best weights as a preset, the folder a trained
model travels in (`lm-zoo-export`, or `python launch/export.py`):

  lm-zoo-export --workdir=runs/x --output=presets/x
  lm-zoo-export --workdir=runs/x --output=presets/x --max_shard_size=500MB

The preset holds config.json, vocab.json, data.json, the weights as
model.safetensors (sharded above --max_shard_size), a README.md model card
and SHA256SUMS (lm_zoo/presets.py; docs/presets.md). `lm_zoo.load` and
the programs' --workdir read it, from its folder or a URL.
"""

import sys

from absl import app, flags

from lm_zoo import cli
from lm_zoo.runs.export import export

flags.DEFINE_string('workdir', None, 'A work directory written by lm-zoo-train.', required=True)
flags.DEFINE_string('output', None, 'The preset folder to write: new or empty.', required=True)
flags.DEFINE_string(
  'max_shard_size',
  '2GB',
  'Weights above this size are split into '
  'model-0000K-of-0000N.safetensors files of at most this size each '
  "(bytes with a unit: '2GB', '500MB', '1GiB').",
)
FLAGS = flags.FLAGS


def _export_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  folder = cli.run(lambda: export(FLAGS.workdir, FLAGS.output, FLAGS.max_shard_size))
  print(f'preset written to {folder}')


def main():
  """The `lm-zoo-export` console script."""
  cli.main(sys.modules[__name__], _export_program)
