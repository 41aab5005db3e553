"""The launch scripts as a user runs them: train a tiny config, then evaluate."""

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, load_experiment, run_script, run_scripts

import lm_zoo
from lm_zoo.runs import load_trained, read_metrics
from lm_zoo.training import train_and_evaluate

# A tiny run of experiments/default.py: 200 training windows of 2 x 16 LSTM;
# whole evaluation windows (rows of 30 valid and 200 test tokens).
TINY = [
  '--config=experiments/default.py',
  '--config.data.train_tokens=2001',
  '--config.data.valid_tokens=301',
  '--config.data.test_tokens=201',
  '--config.model.hidden_size=16',
  '--config.model.embed_size=16',
  '--config.data.bptt=10',
  '--config.train.log_every=4',
  '--config.generate.num_tokens=5',
]


def _train_tiny(workdir, data_dir, *overrides, env=None) -> subprocess.CompletedProcess:
  return run_script(
    ['launch/train.py', *TINY, f'--workdir={workdir}', *overrides],
    {'LM_ZOO_DATA': str(data_dir), **(env or {})},
  )


@pytest.fixture(scope='module')
def trained_run(data_dir, tmp_path_factory):
  """A tiny training run of launch/train.py: (workdir, its stderr)."""
  workdir = tmp_path_factory.mktemp('launch') / 'run'
  train = _train_tiny(workdir, data_dir, env={'PYTHONHASHSEED': '1'})
  assert train.returncode == 0, train.stderr
  return workdir, train.stderr


def test_evaluation_writes_nothing_through_a_link_and_names_a_place_it_cannot_write(
  trained_run, data_dir, tmp_path
):
  """lm-zoo-eval keeps its results in WORKDIR/evaluations: a link there, and
  an --output it cannot write, are refused before scoring; a run whose
  folder cannot take them keeps them in --output alone (with a warning)."""
  linked_dir = shutil.copytree(trained_run[0], tmp_path / 'linked')
  outside = tmp_path / 'outside'
  outside.mkdir()
  shutil.rmtree(linked_dir / 'evaluations', ignore_errors=True)
  os.symlink(outside, linked_dir / 'evaluations')
  full = shutil.copytree(trained_run[0], tmp_path / 'full')
  shutil.rmtree(full / 'evaluations', ignore_errors=True)
  blocked = full / 'evaluations'
  blocked.write_text('')  # in the way of its results
  linked, unwritable, elsewhere, nowhere = run_scripts(
    [
      ['launch/evaluate.py', f'--workdir={linked_dir}'],
      ['launch/evaluate.py', f'--workdir={full}', f'--output={blocked}/results.json'],
      ['launch/evaluate.py', f'--workdir={full}', f'--output={tmp_path}/kept.json'],
      ['launch/evaluate.py', f'--workdir={full}'],
    ],
    {'LM_ZOO_DATA': str(data_dir)},
  )
  assert elsewhere.returncode == 0 and (tmp_path / 'kept.json').is_file()
  assert elsewhere.stderr.startswith(f'warning: {blocked}/static.json cannot be written')
  assert nowhere.returncode == 1 and 'perplexity' not in nowhere.stdout
  assert nowhere.stderr == (
    f'error: {blocked}/static.json cannot be written (File exists): lm-zoo-eval keeps its '
    'results there: clear the way, or keep them elsewhere (--output)\n'
  )
  assert linked.returncode == 1 and not any(outside.iterdir())
  assert linked.stderr == (
    f'error: {linked_dir}/evaluations is a symbolic link: lm_zoo writes '
    'nothing through links inside a work directory; remove it, or use '
    'a new --workdir\n'
  )
  # Refused before the evaluation's minutes, not after them.
  assert unwritable.returncode == 1 and 'perplexity' not in unwritable.stdout
  assert unwritable.stderr.startswith(
    f'error: --output={blocked}/results.json cannot be written (File exists)'
  )
  assert unwritable.stderr.count('\n') == 1 and 'Traceback' not in unwritable.stderr


def test_the_same_command_and_seed_give_bit_identical_parameters(trained_run, data_dir, tmp_path):
  # Another process (another hash seed, so no set or dict order is shared by
  # chance) with the same seed; and a run of another seed, which must differ
  # (trained in this process: it shows that the parameters follow the seed).
  workdir, _ = trained_run
  again, other = tmp_path / 'again', tmp_path / 'other'
  assert _train_tiny(again, data_dir, env={'PYTHONHASHSEED': '2'}).returncode == 0
  config = load_experiment('default')
  for flag in TINY[1:]:  # the flags' overrides, typed as the fields they set
    field, value = flag.removeprefix('--config.').split('=')
    section, name = field.split('.')
    config[section][name] = type(config[section][name])(value)
  config.data.data_dir, config.seed = str(data_dir), 1
  train_and_evaluate(config, other)
  params = [jax.tree.leaves(load_trained(w, str(data_dir))[3]) for w in (workdir, again, other)]
  for a, b in zip(params[0], params[1]):
    np.testing.assert_array_equal(a, b)
  assert not all(np.array_equal(a, c) for a, c in zip(params[0], params[2]))
  losses = [
    [r['loss'] for r in read_metrics(w / 'metrics.jsonl') if 'loss' in r] for w in (workdir, again)
  ]
  assert losses[0] == losses[1]


def test_train_then_evaluate(trained_run, data_dir, tmp_path):
  workdir, log = trained_run
  assert 'tokens/s' in log and 'valid perplexity' in log and 'test perplexity' in log
  assert 'step 4/' in log and 'ETA' in log and 'Run summary' in log
  assert 'sample:' in log
  assert 'orbax' not in log  # library chatter stays below WARNING
  for name in ('config.json', 'metrics.jsonl', 'summary.json', 'checkpoints', 'best'):
    assert (workdir / name).exists(), name
  summary = json.loads((workdir / 'summary.json').read_text())
  # The run recorded the command line that trained it, to type again.
  (command,) = (workdir / 'commands.txt').read_text().splitlines()
  typed = shlex.join(['python', 'launch/train.py', *TINY, f'--workdir={workdir}'])
  assert re.fullmatch(
    rf'\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ lm_zoo {re.escape(lm_zoo.__version__)} '
    rf'in {re.escape(str(REPO))}: {re.escape(typed)}',
    command,
  ), command

  # The programs one after another on the run, each a process of its own.
  data = {'LM_ZOO_DATA': str(data_dir)}
  evaluate, moved, extras, generate, beam, dyneval = run_scripts(
    [
      ['launch/evaluate.py', f'--workdir={workdir}'],
      ['launch/evaluate.py', f'--workdir={workdir}', f'--data_dir={tmp_path}/nowhere'],
      [
        'launch/evaluate.py',
        f'--workdir={workdir}',
        '--config=experiments/evaluate.py:temperature',
        '--config.temperature.base=mc_dropout',
        '--config.splits=valid',
        '--config.mc_dropout.samples=2',
        '--config.mc_dropout.dropout_scale=0',
      ],
      [
        'launch/generate.py',
        f'--workdir={workdir}',
        '--prompt=the company xyzzy',
        '--num_tokens=6',
        '--num_samples=2',
        '--top_k=5',
        '--seed=3',
      ],
      ['launch/generate.py', f'--workdir={workdir}', '--beam_width=3', '--num_tokens=6'],
      [
        'launch/evaluate.py',
        f'--workdir={workdir}',
        '--config=experiments/dyneval_rms.py',
        '--config.dynamic.learning_rate=0,1e-3',
        '--config.dynamic.decay=0',
        '--config.dynamic.segment_length=5',
        '--config.dynamic.ms_batches=2',
        '--config.dynamic.ms_batch_size=2',
      ],
    ],
    data,
  )
  assert evaluate.returncode == 0, evaluate.stderr
  assert f'test: perplexity {summary["test"]["perplexity"]:.2f}' in evaluate.stdout
  # The program read $LM_ZOO_DATA and the run recorded it; the other programs
  # read the recorded folder back, and --data_dir names where the data is now.
  assert json.loads((workdir / 'config.json').read_text())['data']['data_dir'] == str(data_dir)
  assert moved.returncode == 1 and f'{tmp_path}/nowhere does not exist' in moved.stderr

  assert extras.returncode == 0, extras.stderr
  assert 'MC dropout: 2 samples, rates x 0' in extras.stdout
  # Zero dropout: every MC sample is the deterministic model; a tuned
  # temperature can only lower the validation loss.
  tuned_ppl = float(extras.stdout.split('perplexity ')[1].split()[0])
  assert tuned_ppl <= summary['valid']['perplexity'] + 0.01

  assert generate.returncode == 0, generate.stderr
  lines = generate.stdout.strip().splitlines()
  assert len(lines) == 2 and all(line.startswith('the company <unk>') for line in lines)
  assert (
    "warning: the prompt has 1 token(s) outside the vocabulary, read as <unk>: 'xyzzy'\n"
    in generate.stderr
  )
  assert beam.returncode == 0 and len(beam.stdout.strip().splitlines()) == 1

  assert dyneval.returncode == 0, dyneval.stderr
  out = dyneval.stdout
  assert out.count('search: valid loss') == 2 and 'test: perplexity' in out
  # Learning rate 0 is static evaluation at batch 1; the search keeps the best.
  valid_ppl = float(out.split('valid: perplexity ')[1].split()[0])
  assert valid_ppl <= summary['valid']['perplexity'] + 0.01
  # Beside it, the static score of the same tokens and the gain; only the
  # settings the rule reads.
  assert out.count('static on the same tokens: perplexity') == 2
  assert 'rule=rms, learning_rate=' in out and 'decay_mean=coordinates' in out
  kept = json.loads((workdir / 'evaluations' / 'dynamic.json').read_text())
  assert kept['results']['test']['num_tokens'] == kept['static']['test']['num_tokens']


@pytest.mark.slow
def test_meta_train_then_score_and_plot_the_gain(trained_run, data_dir, tmp_path):
  """The meta-learned rule: a brief meta-training, then scores with it; the
  per-segment results of two runs draw the gain along the test stream."""
  workdir, _ = trained_run
  summary = json.loads((workdir / 'summary.json').read_text())
  env = {'LM_ZOO_DATA': str(data_dir)}
  meta = run_script(
    [
      'launch/meta_train.py',
      f'--workdir={workdir}',
      '--config=experiments/dyneval_learned.py',
      '--config.meta_steps=2',
      '--config.num_updates=3',
      '--config.segment_length=4',
      '--config.batch_size=2',
      '--config.fisher_batches=2',
      '--config.fisher_batch_size=2',
      '--config.evaluation.splits=valid',
    ],
    env,
  )
  assert meta.returncode == 0, meta.stderr
  assert 'meta-training: L_meta / K' in meta.stdout and 'valid: perplexity' in meta.stdout
  runs = {}
  # The static run searches lr 0 against a huge one on the first 150 valid
  # tokens only; lr 0 must win.
  for name, flags in (
    (
      'static',
      [
        '--config=experiments/dyneval_sgd.py',
        '--config.dynamic.learning_rate=0,30',
        '--config.dynamic.segment_length=4',
        '--config.dynamic.search_tokens=150',
        '--config.splits=test',
      ],
    ),
    (
      'learned',
      [
        '--config=experiments/evaluate.py:learned',  # the rule in WORKDIR/meta_learner
        '--config.max_tokens=120',
        '--config.splits=test',
      ],
    ),
  ):
    path = tmp_path / f'{name}.json'
    scored = run_script(
      ['launch/evaluate.py', f'--workdir={workdir}', *flags, f'--output={path}'], env
    )
    assert scored.returncode == 0, scored.stderr
    runs[name] = json.loads(path.read_text())
  assert runs['learned']['settings']['segment_length'] == 4  # as meta-trained
  assert runs['learned']['results']['test']['num_tokens'] == 120
  assert runs['static']['settings']['learning_rate'] == 0 and len(runs['static']['search']) == 2
  static = runs['static']['results']['test']
  # Learning rate 0 at batch 1 is the static test score of the training run.
  assert abs(static['perplexity'] - summary['test']['perplexity']) < 0.01
  assert sum(runs['static']['segments']['test']['tokens']) == static['num_tokens']
  plot = run_script(
    [
      'launch/plot.py',
      '--figure=dyneval_gain',
      f'--results={tmp_path / "static.json"},{tmp_path / "learned.json"}',
      f'--output={tmp_path / "gain.png"}',
    ]
  )
  assert plot.returncode == 0, plot.stderr
  assert (tmp_path / 'gain.png').stat().st_size > 0


def test_token_loss_difference_figure_of_two_work_directories(trained_run, tmp_path):
  workdir, _ = trained_run
  plot, one = run_scripts(
    [
      [
        'launch/plot.py',
        '--figure=token_loss_difference',
        f'--workdirs={workdir},{workdir}',
        '--num_tokens=50',
        f'--output={tmp_path / "d.png"}',
      ],
      [
        'launch/plot.py',
        '--figure=token_loss_difference',
        f'--workdirs={workdir}',
        f'--output={tmp_path / "e.png"}',
      ],
    ]
  )
  assert plot.returncode == 0, plot.stderr
  assert (tmp_path / 'd.png').stat().st_size > 0
  assert one.returncode != 0 and 'needs --workdirs=A,B' in one.stderr


def test_clear_errors_instead_of_tracebacks(tmp_path):
  refusals = [  # (command line, the text stderr holds)
    (
      [
        'launch/train.py',
        '--config=experiments/default.py',
        f'--workdir={tmp_path}',
        f'--config.data.data_dir={tmp_path / "nope"}',
      ],
      'error: data folder',
    ),
    (
      [
        'launch/train.py',
        '--config=experiments/default.py',
        f'--workdir={tmp_path}',
        '--config.model.hiden_size=3',
      ],
      'hiden_size',
    ),
    (['launch/evaluate.py', f'--workdir={tmp_path / "empty"}'], 'error:'),
    (
      ['launch/evaluate.py', f'--workdir={tmp_path}', '--config.static.temperature=warm'],
      '--config.static.temperature',
    ),
    (
      [
        'launch/evaluate.py',
        f'--workdir={tmp_path}',
        '--config.evaluator=mc_dropout',
        '--config.mc_dropout.samples=0',
      ],
      'mc_dropout.samples must be a whole number >= 1',
    ),
    (['launch/generate.py', f'--workdir={tmp_path}', '--beam_width=3', '--top_k=5'], '--top_k'),
    (['launch/generate.py', f'--workdir={tmp_path / "empty"}'], 'error:'),
  ]
  for (args, named), refused in zip(refusals, run_scripts([args for args, _ in refusals])):
    assert refused.returncode != 0 and named in refused.stderr, args
    assert 'Traceback' not in refused.stderr, args


@pytest.mark.parametrize(
  'program, flags',
  [
    (
      'lm-zoo-train',
      ['--workdir', '--config.model.hidden_size=200', 'DropConnect on the recurrent matrices'],
    ),
    ('lm-zoo-eval', ['--workdir', '--config.dynamic.learning_rate', 'Monte-Carlo dropout']),
    ('lm-zoo-meta-train', ['--workdir', '--config.meta_steps', '--config.evaluation']),
    ('lm-zoo-generate', ['--workdir', '--beam_width', '--top_k']),
  ],
)
def test_console_scripts_explain_their_flags(program, flags, tmp_path):
  """The installed programs run from any folder and --help documents them."""
  script = pathlib.Path(sys.executable).parent / program
  shown = subprocess.run(
    [str(script), '--help'], cwd=tmp_path, capture_output=True, text=True, timeout=120
  )
  assert shown.returncode == 0 and 'Traceback' not in shown.stderr
  for text in flags:
    assert text in shown.stdout, text


# The launch/ shims' --help: (script, its program, flags it explains).
SHIMS = [
  ('evaluate', 'lm-zoo-eval', ['--config.dynamic.learning_rate']),
  ('plot', 'lm-zoo-plot', ['--figure', '--workdirs', '--results']),
  ('run_task', 'lm-zoo-task', ['--config', '--output']),
  ('export', 'lm-zoo-export', ['--workdir', '--output', '--max_shard_size']),
]


@pytest.fixture(scope='module')
def shims_help():
  return dict(
    zip(
      [script for script, _, _ in SHIMS],
      run_scripts([[f'launch/{script}.py', '--help'] for script, _, _ in SHIMS]),
    )
  )


@pytest.mark.parametrize('script, program, flags', SHIMS)
def test_launch_shims_show_their_programs_help(script, program, flags, shims_help):
  shown = shims_help[script]
  assert program in shown.stdout and 'Traceback' not in shown.stderr
  for text in flags:
    assert text in shown.stdout, text
