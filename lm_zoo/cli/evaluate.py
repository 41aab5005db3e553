r"""Evaluates a work directory's best checkpoint on valid and test
(`lm-zoo-eval`, or `python launch/evaluate.py`):

  lm-zoo-eval --workdir=runs/x [--batch_size=1] [--splits=valid,test]
  lm-zoo-eval --workdir=runs/x --mc_samples=50 --dropout_scale=0.8
  lm-zoo-eval --workdir=runs/x --temperature=tune
  lm-zoo-eval --workdir=runs/x --dyneval=rms \
      --dyneval_lr=3e-5,1e-4,3e-4 --dyneval_decay=0,1e-3 --dyneval_eps=1e-3 \
      --dyneval_output=runs/x/dyneval_rms.json
  lm-zoo-eval --workdir=runs/x --dyneval=learned  # after launch/meta_train.py
"""

import dataclasses
import json
import pathlib
import sys

from absl import app, flags

from lm_zoo import cli
from lm_zoo.training import evaluate_workdir
from lm_zoo.training.checkpoints import write_text_atomically
from lm_zoo.training.dynamic_evaluation import dynamic_evaluate_workdir

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
flags.DEFINE_enum('dyneval', '', ['', 'sgd', 'rms', 'learned'], 'Dynamic evaluation: '
                  'score each segment, then take a gradient step on it (sgd), or an '
                  'RMS-normalised step decaying toward the trained weights (rms), or the '
                  "step of the meta-learned rule in WORKDIR/meta_learner (learned, from "
                  'launch/meta_train.py); empty: static.')
flags.DEFINE_list('dyneval_lr', ['1e-4'], 'Dynamic evaluation learning rates; with '
                  'several values (in any --dyneval_* list) every combination is '
                  'scored on valid and the best is used on every split.')
flags.DEFINE_list('dyneval_decay', ['0'], 'Decay rates toward the trained weights.')
flags.DEFINE_list('dyneval_eps', ['1e-3'], 'RMS epsilon values, added to the RMS of '
                  'training gradients.')
flags.DEFINE_list('dyneval_segment', ['5'], 'Segment lengths (tokens per update).')
flags.DEFINE_enum('dyneval_decay_mean', 'coordinates', ['coordinates', 'tensors'],
                  'RMS: the mean(MS) in the decay rate min(1, decay MS / mean(MS)), over '
                  "every coordinate (lamb's dyneval.py) or over the parameter tensors "
                  "(Krause's dynamiceval.py).")
flags.DEFINE_integer('dyneval_ms_batches', 100, 'RMS: training windows the gradient '
                     'statistics are estimated from.')
flags.DEFINE_integer('dyneval_ms_batch_size', 64, 'RMS: rows of those windows.')
flags.DEFINE_integer('dyneval_search_tokens', 0, 'Search on only the first this many '
                     'validation tokens (0: all); the chosen setting scores whole splits.')
flags.DEFINE_integer('dyneval_max_tokens', 0, 'Score only the first this many tokens '
                     'of each split (0: all).')
flags.DEFINE_string('dyneval_output', None, 'JSON file for the chosen settings, the '
                    'search and each segment\'s NLL and token count per split (the input '
                    'of launch/plot.py --figure=dyneval_gain).')
FLAGS = flags.FLAGS


def _temperature(value: str) -> float | str:
  if value == 'tune':
    return value
  try:
    return float(value)
  except ValueError:
    raise app.UsageError(f"--temperature must be a number or 'tune', got {value!r}")


def _numbers(flag: str, kind=float) -> list:
  try:
    return [kind(v) for v in FLAGS[flag].value]
  except ValueError:
    raise app.UsageError(f'--{flag} must be a list of numbers, got '
                         f'{",".join(FLAGS[flag].value)}')


def dynamic_evaluation() -> None:
  if FLAGS.mc_samples or FLAGS.temperature != '1':
    raise app.UsageError('--dyneval does not combine with --mc_samples or --temperature')
  report = cli.run(lambda: dynamic_evaluate_workdir(
      FLAGS.workdir, FLAGS.dyneval, _numbers('dyneval_lr'), _numbers('dyneval_decay'),
      _numbers('dyneval_eps'), _numbers('dyneval_segment', int), FLAGS.dyneval_decay_mean,
      FLAGS.splits, FLAGS.batch_size or 1, FLAGS.dyneval_ms_batches,
      FLAGS.dyneval_ms_batch_size, FLAGS.dyneval_search_tokens, FLAGS.dyneval_max_tokens,
      FLAGS.data_dir))
  for settings, loss in report.trials:
    print(f'search: valid loss {loss:.4f} with {settings}')
  for split, result in report.results.items():
    print(f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
          f'{result.num_tokens:,} tokens; dynamic evaluation {report.settings})')
  if FLAGS.dyneval_output:
    output = pathlib.Path(FLAGS.dyneval_output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(output, json.dumps({
        'workdir': FLAGS.workdir, 'settings': dataclasses.asdict(report.settings),
        'search': [[dataclasses.asdict(s), loss] for s, loss in report.trials],
        'results': {split: r.as_dict() for split, r in report.results.items()},
        'segments': {split: {'nll': nll.tolist(), 'tokens': tokens.tolist()}
                     for split, (nll, tokens) in report.segments.items()}}))


def _evaluate_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if FLAGS.dyneval:
    return dynamic_evaluation()
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


def main():
  """The `lm-zoo-eval` console script."""
  cli.main(sys.modules[__name__], _evaluate_program)
