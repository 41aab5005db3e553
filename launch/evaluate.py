"""Evaluates a work directory's best checkpoint on valid and test.

`python launch/evaluate.py --workdir=runs/x [--batch_size=1] [--splits=valid,test]`
"""

from absl import app, flags

from lm_zoo import cli
from lm_zoo.training import evaluate_workdir

flags.DEFINE_string('workdir', None, 'A work directory written by launch/train.py.',
                    required=True)
flags.DEFINE_list('splits', ['valid', 'test'], 'Splits to evaluate.')
flags.DEFINE_integer('batch_size', 0, 'Evaluation batch size; 0 uses the '
                     "config's test_batch_size.")
flags.DEFINE_string('data_dir', None, 'Data folder; default: the training run\'s, '
                    'else $LM_ZOO_DATA.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  results = cli.run(lambda: evaluate_workdir(FLAGS.workdir, FLAGS.splits,
                                             FLAGS.batch_size, FLAGS.data_dir))
  for split, result in results.items():
    print(f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
          f'{result.num_tokens:,} tokens)')


if __name__ == '__main__':
  app.run(main)
