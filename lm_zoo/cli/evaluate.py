r"""Scores a work directory's best checkpoint (`lm-zoo-eval`, or
`python launch/evaluate.py`) with the evaluator its --config names:

  lm-zoo-eval --workdir=runs/x                              # static, valid and test
  lm-zoo-eval --workdir=runs/x --config=experiments/evaluate.py:mc_dropout \
      --config.mc_dropout.samples=50 --config.mc_dropout.dropout_scale=0.8
  lm-zoo-eval --workdir=runs/x --config=experiments/evaluate.py:temperature
  lm-zoo-eval --workdir=runs/x --config=experiments/dyneval_rms.py \
      --config.dynamic.learning_rate=3e-5,1e-4,3e-4 --config.dynamic.decay=0,1e-3 \
      --output=runs/x/dyneval_rms.json
  lm-zoo-eval --workdir=runs/x --config=experiments/evaluate.py:learned  # after lm-zoo-meta-train

The results are written as JSON to WORKDIR/evaluations/EVALUATOR.json and to
--output (for dynamic evaluation also the chosen setting, the search, each
segment's NLL and the static score of the same tokens: the input of
`lm-zoo-plot --figure=dyneval_gain`; for token_losses every token's loss).
Dynamic evaluation prints the static score of the same tokens beside its
own, and the gain. What the evaluator chooses (a temperature, a dynamic
evaluation's setting) and each split's result are kept in
WORKDIR/evaluations/progress/ as they are made, until the results are
written: the same command, run again after a kill or preemption, resumes
from them (a preset, or a work directory whose results go to --output only,
keeps nothing).
Every field of the config can be set with --config.FIELD=VALUE; they are
listed under 'Config fields' below.
"""

import json
import pathlib
import sys

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from lm_zoo import cli
from lm_zoo.configs import evaluation_config
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import DynamicEvalSettings, EvalResult
from lm_zoo.presets import is_preset
from lm_zoo.remote import resolve
from lm_zoo.runs.files import EVALUATIONS_DIR, write_text_atomically
from lm_zoo.runs.workdir import refuse_links
from lm_zoo.training import evaluate_workdir
from lm_zoo.training.evaluation_progress import PROGRESS_DIR

config_flags.DEFINE_config_file(
  'config',
  str(cli.EXPERIMENTS / 'evaluate.py'),
  'How to score: an experiments/evaluate.py '
  'or experiments/dyneval_*.py config (--config=FILE[:VARIANT]); the default is static '
  'evaluation of valid and test. Fields: --config.FIELD=VALUE.',
  lock_config=True,
)
flags.DEFINE_string(
  'workdir',
  None,
  'A work directory written by lm-zoo-train, or a preset '
  '(lm-zoo-export): its folder, https:// URL or hf://OWNER/NAME.',
  required=True,
)
flags.DEFINE_string('data_dir', None, cli.DATA_DIR_HELP)
flags.DEFINE_string(
  'output',
  None,
  'JSON file for the results, besides '
  'WORKDIR/evaluations/EVALUATOR.json (a preset is left as it is).',
)
FLAGS = flags.FLAGS


def _describe(config, split: str, result) -> str:
  """One split's line: the score, its loss and tokens, and how it was scored;
  for dynamic evaluation also the static score of the same tokens and the gain."""
  line = (
    f'{split}: {result.summary()}  (loss {result.loss:.4f} nats/token, '
    f'{result.num_tokens:,} tokens; '
  )
  if 'settings' in result.details:
    used = DynamicEvalSettings(**result.details['settings']).used()
    static = EvalResult(result.details['static_loss'], result.num_tokens, result.unit)
    if result.unit == 'word':
      gain = (
        f'perplexity {static.perplexity:.2f}: a gain of '
        f'{static.perplexity - result.perplexity:.2f} '
        f'({1 - result.perplexity / static.perplexity:.1%})'
      )
    else:
      gain = (
        f'bits per character {static.bits_per_token:.4f}: a gain of '
        f'{static.bits_per_token - result.bits_per_token:.4f}'
      )
    settings = ', '.join(f'{k}={v}' for k, v in used.items())
    return line + f'dynamic evaluation: {settings})\n  static on the same tokens: {gain}'
  mc_dropout = ''
  if config.evaluator == 'mc_dropout' or (
    config.evaluator == 'temperature' and config.temperature.base == 'mc_dropout'
  ):
    mc_dropout = (
      f', MC dropout: {config.mc_dropout.samples} samples, rates x '
      f'{config.mc_dropout.dropout_scale:g}'
    )
  return line + f'temperature {result.temperature:.3f}{mc_dropout})'


def _as_json(config, results) -> dict:
  output = {
    'workdir': FLAGS.workdir,
    'evaluator': config.evaluator,
    'config': json.loads(config.to_json_best_effort()),
    'results': {split: r.as_dict() for split, r in results.items()},
  }
  details = {split: r.details for split, r in results.items() if r.details}
  if details:
    first = next(iter(details.values()))
    if 'settings' in first:
      output.update(
        settings=first['settings'], search=[[s, loss] for s, loss in first.get('search', [])]
      )
      output['static'] = {
        split: EvalResult(
          d['static_loss'], results[split].num_tokens, results[split].unit
        ).as_dict()
        for split, d in details.items()
      }
      output['segments'] = {
        split: {'nll': d['segment_nll'].tolist(), 'tokens': d['segment_tokens'].tolist()}
        for split, d in details.items()
      }
    if 'token_losses' in first:
      output['token_losses'] = {
        split: np.asarray(d['token_losses']).tolist() for split, d in details.items()
      }
  return output


def evaluation_section(config):
  """The evaluation config in `config`: itself, or its `evaluation` section
  (a meta-training config's)."""
  if 'evaluator' in config:
    return config
  if 'evaluation' in config and 'evaluator' in config.evaluation:
    return config.evaluation
  raise app.UsageError(
    '--config has no evaluator: give an experiments/evaluate.py or experiments/dyneval_*.py config'
  )


def _evaluate_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  config = evaluation_section(FLAGS.config)
  workdir = cli.run(lambda: resolve(FLAGS.workdir))  # a preset's URL: its cached copy
  # The results go into the work directory: never through a link out of it.
  cli.run(lambda: refuse_links(workdir))
  outputs = cli.run(lambda: _outputs(workdir, config))  # before the evaluation's minutes
  # Kept beside the results, where they can go: a stopped evaluation resumes.
  beside = _beside(workdir, config)
  progress = beside.parent / PROGRESS_DIR if beside in outputs else None
  data_dir = cli.workdir_data_dir(workdir, FLAGS.data_dir)

  def report(results: dict) -> None:  # before the progress goes
    for split, result in results.items():
      search = result.details.get('search', [])
      if search and split == next(iter(results)):
        for settings, loss in search:
          print(f'search: valid loss {loss:.4f} with {settings}')
      print(_describe(config, split, result))
    _write(outputs, json.dumps(_as_json(config, results)))

  cli.run(lambda: evaluate_workdir(workdir, config, data_dir, progress, store=report))


def _beside(workdir: pathlib.Path, config) -> pathlib.Path:
  """Where the evaluator's latest results are kept in the work directory."""
  return workdir / EVALUATIONS_DIR / f'{config.evaluator}.json'


def _outputs(workdir: pathlib.Path, config) -> dict[pathlib.Path, str]:
  """Where the results go, each checked (`cli.check_output`), with what to do
  if it cannot be written: to --output when given, and beside the run
  unless it is a preset (which stays as it was published) or its folder
  cannot take them while --output can."""
  outputs = {}
  if FLAGS.output:
    output, fix = pathlib.Path(FLAGS.output), 'give --output=FILE in a folder you can write'
    cli.check_output(output, fix=fix)
    outputs[output] = fix
  # A folder that is no work directory is named as such by the evaluation.
  if workdir.is_dir() and not is_preset(workdir):
    beside = _beside(workdir, config)
    fix = 'lm-zoo-eval keeps its results there: clear the way, or keep them elsewhere (--output)'
    try:
      cli.check_output(beside, flag='', fix=fix)
    except ConfigError as err:
      if not outputs:
        raise
      print(f'warning: {err}; the results go to --output only', file=sys.stderr)
    else:
      outputs[beside] = fix
  return outputs


def _write(outputs: dict[pathlib.Path, str], text: str) -> None:
  """Writes an evaluation's JSON to every output; one that cannot be
  written is a one-line error once the others are (the scores are printed
  already)."""
  failed = []
  for path, fix in outputs.items():
    try:
      write_text_atomically(path, text)
    except OSError as err:
      failed.append(
        f'the results were printed but cannot be saved to {path} ({err.strerror}): {fix}'
      )
  if failed:
    raise ConfigError(failed[0])


def main():
  """The `lm-zoo-eval` console script."""
  cli.main(
    sys.modules[__name__],
    _evaluate_program,
    '\nConfig fields (lm_zoo/configs.py: evaluation_config):\n'
    + cli.describe_fields(evaluation_config)
    + '\n',
  )
