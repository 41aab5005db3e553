"""Meta-trains the learned weight-update rule (Wolf et al. 2018) for a work
directory's trained model, then scores valid and test with it.

  python launch/meta_train.py --workdir=runs/x --meta_steps=300 --num_updates=40
  python launch/evaluate.py --workdir=runs/x --dyneval=learned   # later, again

The rule is saved to WORKDIR/meta_learner.
"""

from absl import app, flags

from lm_zoo import cli
from lm_zoo.training.dynamic_evaluation import dynamic_evaluate_workdir, meta_train_workdir

flags.DEFINE_string('workdir', None, 'A work directory written by launch/train.py.',
                    required=True)
flags.DEFINE_integer('meta_steps', 300, 'Meta-optimizer (Adam) steps.')
flags.DEFINE_integer('num_updates', 40, 'Updates of the rule unrolled per meta-step '
                     '(truncated backpropagation through this many; the paper: >= 40).')
flags.DEFINE_integer('segment_length', 5, 'Tokens per update (the mini-batch M); '
                     'evaluation uses the same.')
flags.DEFINE_integer('batch_size', 4, 'Stream positions per meta-step.')
flags.DEFINE_integer('hidden', 16, 'Hidden units of the coordinate-wise gate network.')
flags.DEFINE_enum('prior', 'sgd', ['sgd', 'rms'], 'The rule a fresh meta-learner starts as: '
                  'SGD with a pull toward the trained weights, or RMS dynamic evaluation '
                  "(MS from theta_0's Fisher) that it learns to modulate.")
flags.DEFINE_float('initial_lr', 0.03, 'The learning rate of the rule it starts as.')
flags.DEFINE_float('initial_decay', 0.0067, 'The pull toward the trained weights per update '
                   'the rule starts from (sgd: COPY 1 - d, FLUSH d; rms: its lambda). With '
                   'sgd on PTB, 1e-3 after 100 meta-steps diverged on the validation stream '
                   '(WORKSPACE.md).')
flags.DEFINE_float('initial_eps', 1e-3, 'Epsilon of the RMS rule it starts as (rms only).')
flags.DEFINE_enum('decay_mean', 'coordinates', ['coordinates', 'tensors'], 'rms: the '
                  'mean(MS) in its decay rate min(1, lambda MS / mean(MS)), over every '
                  "coordinate (lamb) or over the parameter tensors (Krause's code).")
flags.DEFINE_bool('carry_over', False, 'Continue along the training stream from one '
                  'meta-step to the next (weights and recurrent state carried over) instead '
                  'of restarting from the trained weights at random positions.')
flags.DEFINE_float('meta_lr', 1e-3, 'Adam learning rate of the meta-parameters.')
flags.DEFINE_integer('fisher_batches', 100, 'Training windows for the diagonal Fisher '
                     'precision of the long-term memory theta_0.')
flags.DEFINE_integer('fisher_batch_size', 64, 'Rows of those windows.')
flags.DEFINE_bool('first_order', False, 'Treat the LM gradient fed to the rule as a '
                  'constant (no second derivatives).')
flags.DEFINE_integer('log_every', 10, 'Log the mean L_meta / K every this many meta-steps.')
flags.DEFINE_integer('seed', 0, 'Seed of the gate network and the stream positions.')
flags.DEFINE_list('splits', ['valid', 'test'], 'Splits to score with the trained rule; '
                  'empty: none.')
flags.DEFINE_string('data_dir', None, "Data folder; default: the training run's, else "
                    '$LM_ZOO_DATA.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  losses = cli.run(lambda: meta_train_workdir(
      FLAGS.workdir, FLAGS.meta_steps, FLAGS.num_updates, FLAGS.segment_length,
      FLAGS.batch_size, FLAGS.hidden, FLAGS.initial_lr, FLAGS.initial_decay, FLAGS.meta_lr,
      FLAGS.fisher_batches, FLAGS.fisher_batch_size, FLAGS.first_order, FLAGS.seed,
      FLAGS.data_dir, FLAGS.log_every, FLAGS.prior, FLAGS.initial_eps, FLAGS.carry_over,
      FLAGS.decay_mean))
  if len(losses):
    tenth = max(1, len(losses) // 10)
    print(f'meta-training: L_meta / K {losses[:tenth].mean():.4f} over the first '
          f'{tenth} steps, {losses[-tenth:].mean():.4f} over the last {tenth}')
  if FLAGS.splits:
    report = cli.run(lambda: dynamic_evaluate_workdir(
        FLAGS.workdir, 'learned', splits=FLAGS.splits, data_dir=FLAGS.data_dir))
    for split, result in report.results.items():
      print(f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
            f'{result.num_tokens:,} tokens; learned update rule)')


if __name__ == '__main__':
  app.run(main)
