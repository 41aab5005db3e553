"""Evaluates a work directory's best checkpoint on valid and test.

  python launch/evaluate.py --workdir=runs/x [--batch_size=1] [--splits=valid,test]
  python launch/evaluate.py --workdir=runs/x --mc_samples=50 --dropout_scale=0.8
  python launch/evaluate.py --workdir=runs/x --temperature=tune
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
flags.DEFINE_integer('mc_samples', 0, 'Monte-Carlo dropout: average the predicted '
                     'probabilities over this many dropout masks (the Mogrifier paper '
                     'uses 200); 0 evaluates with dropout off.')
flags.DEFINE_float('dropout_scale', 1.0, 'With --mc_samples: multiply every dropout '
                   'rate of the model by this factor.')
flags.DEFINE_string('temperature', '1', "Softmax temperature (logits are divided by "
                    "it), or 'tune' to pick the one minimising the validation loss "
                    'by golden-section search in [0.5, 2] and use it on every split.')
flags.DEFINE_integer('seed', 0, 'Seed of the MC-dropout masks.')
FLAGS = flags.FLAGS


def _temperature(value: str) -> float | str:
  if value == 'tune':
    return value
  try:
    return float(value)
  except ValueError:
    raise app.UsageError(f"--temperature must be a number or 'tune', got {value!r}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  temperature = _temperature(FLAGS.temperature)
  if FLAGS.dropout_scale != 1.0 and not FLAGS.mc_samples:
    raise app.UsageError('--dropout_scale applies to MC dropout only: set --mc_samples')
  results = cli.run(lambda: evaluate_workdir(
      FLAGS.workdir, FLAGS.splits, FLAGS.batch_size, FLAGS.data_dir,
      mc_samples=FLAGS.mc_samples, dropout_scale=FLAGS.dropout_scale,
      temperature=temperature, seed=FLAGS.seed))
  mc_dropout = (f', MC dropout: {FLAGS.mc_samples} samples, rates x {FLAGS.dropout_scale:g}'
                if FLAGS.mc_samples else '')
  for split, result in results.items():
    print(f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
          f'{result.num_tokens:,} tokens; temperature {result.temperature:.3f}{mc_dropout})')


if __name__ == '__main__':
  app.run(main)
