"""Hostile command lines through lm-zoo-tune, lm-zoo-download, lm-zoo-plot,
lm-zoo-task and lm-zoo-meta-train: each ends in a one-line error that names
the flag or file (exit status 1, no traceback anywhere in the output) or in
a correct result (tests/hostile_programs.py runs them)."""

import pytest
from hostile_programs import check, run_probes

# id -> (program, its flags ({t}, {w}, {d} filled in), what stderr's error line
# says; None where the command must succeed)
PROBES = {
  # lm-zoo-tune
  'tune: an unknown variant': (
    'tune',
    ['--workdir={t}/tune', '--tune=experiments/tune_ptb_small.py:nope'],
    "--tune: ValueError: variant must be 'lstm' or 'mogrifier', got 'nope'",
  ),
  'tune: -1 trials': (
    'tune',
    ['--workdir={t}/tune', '--tune.study.num_trials=-1'],
    'tune.study.num_trials must be at least 1, got -1',
  ),
  'tune: a NaN timeout': (
    'tune',
    ['--workdir={t}/tune', '--timeout=nan'],
    'timeout must be >= 0 seconds (0: none), got nan',
  ),
  'tune: a negative worker': ('tune', ['--workdir={t}/tune', '--worker=-1'], '--worker: '),
  'tune: a training config as --tune': (
    'tune',
    ['--workdir={t}/tune', '--tune=experiments/default.py'],
    '--tune is not a tuning config: it has no kind, study, space, base (a training config?)',
  ),
  'tune: a training config as --tune, report only': (
    'tune',
    ['--workdir={t}/tune', '--tune=experiments/default.py', '--report_only'],
    '--tune is not a tuning config: it has no kind, study, space, base',
  ),
  'tune: an empty workdir': (
    'tune',
    ['--workdir=', '--report_only'],
    '--workdir is empty: name a folder for the study',
  ),
  'tune: a workdir that is a file': (
    'tune',
    ['--workdir={t}/file.txt'],
    '--workdir={t}/file.txt is a file, not a folder',
  ),
  'tune: a NaN bound of the space': (
    'tune',
    [
      '--workdir={t}/tune',
      '--tune=experiments/tune_ptb_small.py:mogrifier',
      '--tune.space.learning_rate.low=nan',
    ],
    'tune.space.learning_rate: low nan is above high',
  ),
  'tune: a SQLite file in no folder': (
    'tune',
    ['--workdir={t}/tune', '--tune.study.storage=sqlite:///{t}/nope/x/study.db'],
    'the study database sqlite:///{t}/nope/x/study.db cannot be read (unable to open '
    'database file)',
  ),
  'tune: a database URL of no known kind': (
    'tune',
    ['--workdir={t}/tune', '--tune.study.storage=bogus://x'],
    "tune.study.storage='bogus://x' is not a database URL SQLAlchemy can open",
  ),
  'tune: a negative grace period': (
    'tune',
    ['--workdir={t}/tune', '--tune.study.grace_period=-5'],
    'tune.study.grace_period=-5 must be a whole number of seconds, at least 1',
  ),
  'tune: a study database cut short': (
    'tune',
    ['--workdir={t}/cut_study'],
    'the study database sqlite:///{t}/cut_study/study.db cannot be read (database disk '
    'image is malformed): restore it',
  ),
  'tune: a trial whose model is below its budget': (
    'tune',
    ['--workdir={t}/tune_budget', '--tune.base.data.data_dir={d}']
    + ['--tune.base.model.param_budget=1000'],
    'model.param_budget 1,000 is below the smallest model',
  ),
  'tune: an unknown sampler': (
    'tune',
    ['--workdir={t}/tune', '--tune.study.sampler=grid'],
    "tune.study.sampler='grid' is not known: choose one of tpe, random",
  ),
  # lm-zoo-download
  'download: an unknown dataset': (
    'download',
    ['--data_dir={t}/dl', '--datasets=ptb,nope'],
    "unknown dataset 'nope': choose from ptb, wikitext2, ptb_char, mnist",
  ),
  'download: no dataset': ('download', ['--data_dir={t}/dl', '--datasets='], None),
  'download: a data folder that is a file': (
    'download',
    ['--data_dir={t}/file.txt', '--verify_only'],
    'files missing or with a wrong checksum in {t}/file.txt',
  ),
  'download: verify an empty folder': (
    'download',
    ['--data_dir={t}/empty_dir', '--verify_only', '--datasets=ptb'],
    'files missing or with a wrong checksum in {t}/empty_dir: run lm-zoo-download',
  ),
  'download: a mirror with nothing': (
    'download',
    ['--data_dir={t}/dl', '--datasets=ptb', '--mirror=file://{t}/empty_dir'],
    'copy train.txt, valid.txt, test.txt into {t}/dl/ptb/ by hand',
  ),
  'download: a mirror of no known scheme': (
    'download',
    ['--data_dir={t}/dl', '--datasets=ptb', '--mirror=bogus://x'],
    'could not fetch bogus://x/ptb/train.txt (unknown url type: bogus)',
  ),
  # lm-zoo-plot
  'plot: an unknown figure': (
    'plot',
    ['--figure=pie', '--output={t}/x.png'],
    '--figure: value should be one of <mogrifier_ablation|',
  ),
  'plot: no --output': (
    'plot',
    ['--figure=curves'],
    '--output: Flag --output must have a value other than None.',
  ),
  'plot: garbled results': (
    'plot',
    ['--figure=reverse_copy', '--results={t}/garbled.json', '--output={t}/x.png'],
    '{t}/garbled.json is damaged (JSONDecodeError',
  ),
  'plot: results of the wrong shape': (
    'plot',
    ['--figure=robustness', '--results={t}/list.json', '--output={t}/x.png'],
    '--results={t}/list.json is not the rows of a robustness experiment',
  ),
  'plot: curves of a missing workdir': (
    'plot',
    ['--figure=curves', '--workdirs={t}/nope', '--output={t}/x.png'],
    '{t}/nope/metrics.jsonl not found',
  ),
  'plot: one dyneval result': (
    'plot',
    ['--figure=dyneval_gain', '--results={t}/list.json', '--output={t}/x.png'],
    '--figure=dyneval_gain needs --results=STATIC.json,RUN.json',
  ),
  'plot: garbled dyneval results': (
    'plot',
    ['--figure=dyneval_gain', '--results={t}/garbled.json,{t}/garbled.json', '--output={t}/x.png'],
    '{t}/garbled.json is damaged (JSONDecodeError',
  ),
  'plot: dyneval results without the split drawn': (
    'plot',
    ['--figure=dyneval_gain', '--split=valid', '--results={t}/test_only.json,{t}/test_only.json']
    + ['--output={t}/x.png'],
    "a dynamic evaluation result has no 'valid' split: draw one it scored (test)",
  ),
  'plot: --output under a file': (
    'plot',
    ['--figure=curves', '--workdirs={w}', '--output={t}/file.txt/x.png'],
    '--output={t}/file.txt/x.png cannot be written (File exists)',
  ),
  'plot: token losses of one workdir': (
    'plot',
    ['--figure=token_loss_difference', '--workdirs={w}', '--output={t}/x.png'],
    '--figure=token_loss_difference needs --workdirs=A,B',
  ),
  'plot: token losses of an unknown split': (
    'plot',
    ['--figure=token_loss_difference', '--workdirs={w},{w}', '--split=trian', '--output={t}/x.png'],
    "unknown split 'trian': choose one of train, valid, test",
  ),
  'plot: token losses of -5 tokens': (
    'plot',
    [
      '--figure=token_loss_difference',
      '--workdirs={w},{w}',
      '--num_tokens=-5',
      '--output={t}/x.png',
    ],
    '--num_tokens: ',
  ),
  'plot: an ablation with a garbled summary': (
    'plot',
    ['--figure=mogrifier_ablation', '--workdir_prefix={t}/_empty_v', '--output={t}/x.png'],
    "no LSTM or rN variant among ['ocab']",
  ),
  # lm-zoo-task
  'task: a config without a task': (
    'task',
    ['--config=experiments/default.py', '--output={t}/rows.json'],
    'config.task is None: choose one of reverse_copy',
  ),
  'task: a Mogrifier rank larger than its matrix': (
    'task',
    [
      '--config=experiments/reverse_copy.py',
      '--config.hidden_size=8',
      '--config.models.mogrifier.rank=32',
      '--output={t}/rc.json',
    ],
    'config.models.mogrifier: LowRankDense: rank 32 is larger than the (8, 16) matrix',
  ),
  'task: --output under a file': (
    'task',
    ['--config=experiments/tail_regression.py', '--output={t}/file.txt/rows.json'],
    '--output={t}/file.txt/rows.json cannot be written',
  ),
  'task: no --output': (
    'task',
    ['--config=experiments/tail_regression.py'],
    '--output: Flag --output must have a value other than None.',
  ),
  # lm-zoo-meta-train
  'meta-train: no work directory there': (
    'meta_train',
    ['--workdir={t}/nope'],
    '{t}/nope/config.json not found',
  ),
  'meta-train: negative meta steps': (
    'meta_train',
    ['--workdir={w}', '--config.meta_steps=-1'],
    'meta_steps must be a whole number >= 0, got -1',
  ),
  'meta-train: an evaluation config': (
    'meta_train',
    ['--workdir={w}', '--config=experiments/evaluate.py'],
    'the config is not a meta-training config (it has no prior)',
  ),
}


@pytest.fixture(scope='module')
def outcomes(hostile_folders):
  return run_probes(PROBES, hostile_folders)


@pytest.mark.parametrize('probe', PROBES)
def test_a_hostile_command_line_is_one_error_line_or_a_result(probe, outcomes, hostile_folders):
  check(outcomes[probe], PROBES[probe][2], hostile_folders)
