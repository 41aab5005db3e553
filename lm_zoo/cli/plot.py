r"""Draws a results figure as PNG (`lm-zoo-plot`, or `python launch/plot.py`):

  lm-zoo-plot --figure=mogrifier_ablation --workdir_prefix=runs/abl_ \
      --output=figures/mogrifier_ablation.png
  lm-zoo-plot --figure=reverse_copy --results=runs/reverse_copy.json \
      --output=figures/reverse_copy.png
  lm-zoo-plot --figure=tail_regression --results=runs/tail_regression.json \
      --output=figures/tail_regression.png
  lm-zoo-plot --figure=robustness --results=runs/alstm_robustness.json \
      --output=figures/robustness.png
  lm-zoo-plot --figure=curves --workdirs=runs/abl_lstm,runs/abl_r5 \
      --output=figures/curves.png
  lm-zoo-plot --figure=dyneval_gain \
      --results=runs/x/static.json,runs/x/sgd.json,runs/x/rms.json --output=figures/gain.png
  lm-zoo-plot --figure=token_loss_difference --workdirs=runs/a,runs/b \
      --split=test --num_tokens=3000 --output=figures/difference.png
  lm-zoo-plot --figure=tuning_progress --workdirs=runs/tune_lstm,runs/tune_mogrifier \
      --output=figures/tuning_progress.png
"""

import json
import pathlib
import sys

from absl import app, flags

from lm_zoo import cli, plots
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import token_losses
from lm_zoo.runs import load_trained

FIGURES = {
  'reverse_copy': plots.reverse_copy_figure,
  'tail_regression': plots.tail_regression_figure,
  'robustness': plots.robustness_figure,
  'seeds': plots.seed_study_figure,
}
flags.DEFINE_enum(
  'figure',
  None,
  [
    'mogrifier_ablation',
    *FIGURES,
    'curves',
    'dyneval_gain',
    'token_loss_difference',
    'tuning_progress',
  ],
  'mogrifier_ablation: validation perplexity against rounds from '
  'the ablation work directories; reverse_copy: cross-entropy against '
  'length; tail_regression: predictions against truth; robustness: '
  'the spread of validation perplexity over sampled dropout rates; '
  'seeds: valid and test perplexity per model over the seeds of a seed '
  'study (all four from --results); curves: training and validation '
  'perplexity of work directories against step; dyneval_gain: the '
  'perplexity gain of '
  'dynamic evaluation along the --split stream, from --results: the JSON '
  'files of lm-zoo-eval --output with a dynamic evaluator, the static one '
  '(learning rate 0) first, each labelled by its file name; token_loss_difference: '
  "the per-token loss of the first of two --workdirs minus the second's "
  'along the first --num_tokens of --split; tuning_progress: the best valid '
  'perplexity so far against trials finished, per lm-zoo-tune --workdirs '
  '(a colour per study name: the same study run with several sampler seeds).',
)
flags.DEFINE_string('output', None, 'PNG file to write.')
flags.DEFINE_string(
  'workdir_prefix',
  'runs/abl_',
  'mogrifier_ablation: work directories are PREFIX + variant (lstm, r1..r6, nozigzag, ...).',
)
flags.DEFINE_string(
  'results',
  None,
  'reverse_copy, tail_regression, robustness, seeds: the JSON '
  'written by lm-zoo-task; dyneval_gain: a comma-separated list '
  'of lm-zoo-eval --output files.',
)
flags.DEFINE_list(
  'workdirs',
  [],
  'curves: work directories to draw; '
  'token_loss_difference: the two to compare (trained on one corpus); '
  'tuning_progress: the work directories of lm-zoo-tune studies.',
)
flags.DEFINE_string('split', 'test', 'dyneval_gain, token_loss_difference: the split drawn.')
flags.DEFINE_integer('num_tokens', 3000, 'token_loss_difference: tokens scored.', lower_bound=1)
flags.DEFINE_string('title', '', 'Figure title.')
flags.mark_flags_as_required(['figure', 'output'])
FLAGS = flags.FLAGS


def ablation_perplexities(prefix: str) -> dict[str, float]:
  """Validation perplexity of each finished ablation run `prefix + variant`."""
  prefix_path = pathlib.Path(prefix)
  found = {}
  for summary in sorted(prefix_path.parent.glob(prefix_path.name + '*/summary.json')):
    variant = summary.parent.name[len(prefix_path.name) :]
    found[variant] = json.loads(summary.read_text())['valid']['perplexity']
  if not found:
    raise ConfigError(
      f'no {prefix}VARIANT/summary.json found: train the ablation with lm-zoo-train first'
    )
  return found


def _read_json(path: pathlib.Path):
  try:
    return json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ConfigError(f'{path} is damaged ({type(err).__name__}: {err}): write it again') from None


def draw() -> pathlib.Path:
  cli.check_output(pathlib.Path(FLAGS.output), 'PNG')
  if FLAGS.figure == 'mogrifier_ablation':
    return plots.mogrifier_ablation_figure(
      ablation_perplexities(FLAGS.workdir_prefix), FLAGS.output, FLAGS.title
    )
  if FLAGS.figure in FIGURES:
    results = pathlib.Path(FLAGS.results or f'runs/{FLAGS.figure}.json')
    if not results.is_file():
      raise ConfigError(
        f'{results} not found: run lm-zoo-task with the {FLAGS.figure} '
        'experiment first (--config=experiments/NAME.py --output=FILE)'
      )
    try:
      return FIGURES[FLAGS.figure](_read_json(results), FLAGS.output, FLAGS.title)
    except (KeyError, TypeError, IndexError, AttributeError) as err:
      raise ConfigError(
        f'--results={results} is not the rows of a {FLAGS.figure} '
        f'experiment ({type(err).__name__}: {err}): write it with '
        f'lm-zoo-task --config=experiments/{FLAGS.figure}.py'
      ) from None
  if FLAGS.figure == 'dyneval_gain':
    return dyneval_gain()
  if FLAGS.figure == 'token_loss_difference':
    return token_loss_difference()
  if FLAGS.figure == 'tuning_progress':
    return tuning_progress()
  if not FLAGS.workdirs:
    raise ConfigError('--figure=curves needs --workdirs')
  return plots.curves_figure(
    {pathlib.Path(w).name: w for w in FLAGS.workdirs}, FLAGS.output, FLAGS.title
  )


def dyneval_gain() -> pathlib.Path:
  files = [pathlib.Path(f) for f in (FLAGS.results or '').split(',') if f]
  if len(files) < 2:
    raise ConfigError('--figure=dyneval_gain needs --results=STATIC.json,RUN.json[,...]')
  for f in files:
    if not f.is_file():
      raise ConfigError(f'{f} not found: write it with lm-zoo-eval --output')
  static, *runs = [_read_json(f) for f in files]
  return plots.dyneval_gain_figure(
    {f.stem: run for f, run in zip(files[1:], runs)},
    static,
    FLAGS.output,
    split=FLAGS.split,
    title=FLAGS.title,
  )


def token_loss_difference() -> pathlib.Path:
  if len(FLAGS.workdirs) != 2:
    raise ConfigError('--figure=token_loss_difference needs --workdirs=A,B')
  labels = [pathlib.Path(w).name for w in FLAGS.workdirs]
  if labels[0] == labels[1]:
    labels = [f'{labels[0]} ({i})' for i in (1, 2)]
  losses, vocabs = {}, []
  for label, workdir in zip(labels, FLAGS.workdirs):
    config, corpus, model, params = load_trained(workdir)
    ids = corpus.split(FLAGS.split)[: FLAGS.num_tokens + 1]
    losses[label] = token_losses(model, params, ids, config.data.bptt)
    vocabs.append(corpus.vocab)
  if vocabs[0] != vocabs[1]:
    raise ConfigError(f'{" and ".join(FLAGS.workdirs)} were trained on different corpora')
  tokens = [vocabs[0].tokens[i] for i in ids[1:]]
  return plots.token_loss_difference_figure(losses, tokens, FLAGS.output, title=FLAGS.title)


def tuning_progress() -> pathlib.Path:
  if not FLAGS.workdirs:
    raise ConfigError('--figure=tuning_progress needs --workdirs=STUDY_WORKDIR[,...]')
  from lm_zoo.tuning import best_so_far, read_study  # needs the [tune] extra

  studies = {}
  for workdir in FLAGS.workdirs:
    study = read_study(workdir)
    studies.setdefault(study.study_name, []).append(best_so_far(study))
  return plots.tuning_progress_figure(studies, FLAGS.output, FLAGS.title)


def _plot_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  print(f'wrote {cli.run(draw)}')


def main():
  """The `lm-zoo-plot` console script."""
  cli.main(sys.modules[__name__], _plot_program)
