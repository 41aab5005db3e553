"""Seed studies: the paired statistics against scipy's paired t-test, and a
tiny study of real runs (resumable, seeded, one work directory per run)."""

import json
import math
import pathlib
import shutil

import numpy as np
import pytest
from conftest import hold_lock, tiny_lm_config
from scipy import stats

from lm_zoo.errors import ConfigError
from lm_zoo.tasks import run_seed_study, seed_report, summarise
from lm_zoo.tasks.seeds import mean_and_spread, paired_difference


def test_paired_interval_excludes_zero_exactly_when_the_paired_t_test_rejects():
  rng = np.random.default_rng(0)
  for n in (2, 3, 5):
    for shift in (0.0, 0.5, 2.0):
      ref = rng.normal(100, 3, n)
      other = ref + shift + rng.normal(0, 1, n)
      d = paired_difference(dict(enumerate(other)), dict(enumerate(ref)))
      assert d['n'] == n
      np.testing.assert_allclose(d['mean'], np.mean(other - ref), rtol=1e-12)
      np.testing.assert_allclose(d['std'], np.std(other - ref, ddof=1), rtol=1e-12)
      # The interval's edge is where the two-sided p-value crosses 0.05.
      p = stats.ttest_rel(other, ref).pvalue
      assert d['resolved'] == (p < 0.05)
      edge = d['mean'] - math.copysign(d['half_width'], d['mean'])
      np.testing.assert_allclose(stats.ttest_1samp(other - ref, edge).pvalue, 0.05, rtol=1e-6)


def test_pairs_are_the_seeds_both_models_have():
  d = paired_difference({0: 10.0, 1: 12.0, 5: 99.0}, {0: 9.0, 1: 9.0, 2: 50.0})
  assert (d['n'], d['mean']) == (2, 2.0)
  assert math.isnan(paired_difference({0: 1.0}, {0: 2.0})['half_width'])
  assert math.isnan(mean_and_spread([3.0])[1])


def _row(model, seed, valid, test):
  return {'model': model, 'seed': seed, 'valid_perplexity': valid, 'test_perplexity': test}


def test_summary_puts_the_reference_first_and_leaves_diverged_runs_out_of_the_means():
  rows = [
    _row('mog', 0, 150.0, 140.0),
    _row('lstm', 0, 160.0, 150.0),
    _row('mog', 1, math.inf, math.inf),
    _row('lstm', 1, 162.0, 153.0),
    _row('mog', 2, 154.0, 146.0),
    _row('lstm', 2, 161.0, 152.0),
  ]
  summary = summarise(rows, 'lstm')
  assert list(summary) == ['lstm', 'mog']
  assert summary['mog']['diverged'] == 1 and summary['mog']['seeds'] == [0, 1, 2]
  assert summary['mog']['valid'] == (152.0, pytest.approx(math.sqrt(8)))
  assert summary['mog']['valid_vs_reference']['n'] == 2  # seed 1 has no pair
  assert summary['mog']['valid_vs_reference']['mean'] == -8.5
  report = seed_report(rows, 'lstm')
  assert '| mog | 3 (1 diverged) | 152.00 ± 2.83 | 143.00 ± 4.24 |' in report
  # differences -10 and -7: std 2.12, t(0.975, 1) = 12.71, half-width 19.06
  assert '| mog | 2 | -8.50 ± 2.12 [-27.56, +10.56] |' in report
  one_seed = seed_report(rows[:2], 'lstm')
  assert '| mog | 1 | 150.00 | 140.00 |' in one_seed
  assert '| mog | 1 | -10.00 (one pair: no interval) |' in one_seed
  with pytest.raises(ConfigError, match='reference'):
    summarise(rows, 'gru')


def _study(tiny_config, folder):
  import ml_collections

  tiny_config.train.num_epochs = 1
  tiny_config.generate.num_lines = 0
  wider = ml_collections.ConfigDict(tiny_config.to_dict())
  wider.model.hidden_size = 24
  c = ml_collections.ConfigDict()
  c.task = 'seeds'
  c.models = ml_collections.ConfigDict({'lstm': tiny_config, 'wider': wider})
  c.seeds = (3, 4)
  c.reference = 'lstm'
  c.workdir = str(folder / 'study')
  return c


@pytest.fixture
def study(tiny_config, tmp_path):
  return _study(tiny_config, tmp_path)


@pytest.fixture(scope='module')
def held_study(data_dir, tmp_path_factory):
  """The study with another worker holding lstm_s3, which it stops holding
  (without training it) once this one has finished wider_s4: (study, folder,
  rows, each run's summary.json modification time as the study left it)."""
  folder = tmp_path_factory.mktemp('held_study')
  study = _study(tiny_lm_config(data_dir), folder)
  holder = hold_lock(folder / 'study' / 'lstm_s3', folder / 'study' / 'wider_s4' / 'summary.json')
  rows = run_seed_study(study)
  holder.wait(timeout=30)
  finished = {
    r['workdir']: (pathlib.Path(r['workdir']) / 'summary.json').stat().st_mtime_ns for r in rows
  }
  return study, folder, rows, finished


def test_study_trains_each_model_per_seed_and_resumes(held_study):
  study, tmp_path, rows, _ = held_study
  assert [(r['model'], r['seed']) for r in rows] == [
    ('lstm', 3),
    ('wider', 3),
    ('lstm', 4),
    ('wider', 4),
  ]
  for row in rows:
    config = json.loads(
      (tmp_path / 'study' / f'{row["model"]}_s{row["seed"]}' / 'config.json').read_text()
    )
    assert config['seed'] == row['seed']
    assert math.isfinite(row['valid_perplexity']) and math.isfinite(row['test_perplexity'])
  # Seeds draw different models; the seed is the only difference between runs.
  assert rows[0]['valid_perplexity'] != rows[2]['valid_perplexity']
  # A second call reads finished runs back instead of training them again.
  path = tmp_path / 'study' / 'wider_s4' / 'summary.json'
  summary = json.loads(path.read_text())
  summary['test']['perplexity'] = 1.5
  path.write_text(json.dumps(summary))
  assert run_seed_study(study)[3]['test_perplexity'] == 1.5


def test_a_run_another_worker_holds_is_left_to_it_then_waited_for(held_study):
  # This worker trains the three other runs, then resumes lstm_s3.
  _, _, rows, finished = held_study
  assert [(r['model'], r['seed']) for r in rows] == [
    ('lstm', 3),
    ('wider', 3),
    ('lstm', 4),
    ('wider', 4),
  ]
  assert max(finished, key=finished.get).endswith('lstm_s3')
  assert all(math.isfinite(r['test_perplexity']) for r in rows)


@pytest.fixture(scope='module')
def held_stacks(data_dir, tmp_path_factory):
  """The study stacked, with another worker holding lstm's stack, which it
  stops holding (without training it) once this one has finished wider's:
  (study, folder, rows, each stack's summary.json modification time as the
  study left it)."""
  folder = tmp_path_factory.mktemp('held_stacks')
  study = _study(tiny_lm_config(data_dir), folder)
  study.stack = True
  holder = hold_lock(
    folder / 'study' / 'lstm_s3-4', folder / 'study' / 'wider_s3-4' / 'summary.json'
  )
  rows = run_seed_study(study)
  holder.wait(timeout=30)
  finished = {
    name: (folder / 'study' / f'{name}_s3-4' / 'summary.json').stat().st_mtime_ns
    for name in ('lstm', 'wider')
  }
  return study, folder, rows, finished


def test_a_stacked_study_trains_each_models_seeds_at_once_and_reads_them_back(held_stacks):
  # That seed s of a stack is the run seed s trains alone: tests/test_stacked.py.
  study, tmp_path, rows, _ = held_stacks
  study = study.copy_and_resolve_references()
  study.models = {'lstm': study.models.lstm}
  rows = [r for r in rows if r['model'] == 'lstm']
  assert [(r['model'], r['seed']) for r in rows] == [('lstm', 3), ('lstm', 4)]
  for row in rows:
    folder = tmp_path / 'study' / f'{row["model"]}_s3-4' / f'seed_{row["seed"]}'
    assert row['workdir'] == str(folder)
    assert json.loads((folder / 'config.json').read_text())['seed'] == row['seed']
    assert (
      json.loads((folder / 'summary.json').read_text())['test']['perplexity']
      == (row['test_perplexity'])
    )
  assert rows[0]['valid_perplexity'] != rows[1]['valid_perplexity']
  # A second call reads the finished stack back.
  path = tmp_path / 'study' / 'lstm_s3-4' / 'summary.json'
  summary = json.loads(path.read_text())
  summary['runs'][1]['test']['perplexity'] = 1.5
  path.write_text(json.dumps(summary))
  assert run_seed_study(study)[1]['test_perplexity'] == 1.5


def test_a_stack_another_worker_holds_is_left_to_it_then_waited_for(held_stacks):
  # This worker trains wider's stack, then lstm's itself.
  _, _, rows, finished = held_stacks
  assert [(r['model'], r['seed']) for r in rows] == [
    ('lstm', 3),
    ('wider', 3),
    ('lstm', 4),
    ('wider', 4),
  ]
  assert finished['lstm'] > finished['wider']
  assert all(math.isfinite(r['test_perplexity']) for r in rows)


def test_a_diverged_stack_trains_its_seeds_one_by_one_once(study, tmp_path, monkeypatch):
  from lm_zoo.errors import TrainingError
  from lm_zoo.tasks import runs

  study.stack = True
  study.models = {'lstm': study.models.lstm}
  stacks, alone = [], runs.train_and_evaluate

  def diverging_stack(config, workdir, num_seeds=1):  # the runs alone train
    if num_seeds == 1:
      return alone(config, workdir)
    stacks.append(workdir)
    raise TrainingError('seed 4: non-finite loss or gradient at step 3')

  monkeypatch.setattr(runs, 'train_and_evaluate', diverging_stack)
  rows = run_seed_study(study)
  assert stacks == [tmp_path / 'study' / 'lstm_s3-4']
  assert 'seed 4' in (tmp_path / 'study' / 'lstm_s3-4' / 'diverged.json').read_text()
  assert [r['workdir'] for r in rows] == [str(tmp_path / 'study' / f'lstm_s{s}') for s in (3, 4)]
  assert all(math.isfinite(r['test_perplexity']) for r in rows)
  assert run_seed_study(study) == rows and len(stacks) == 1  # the runs alone are read back
  # Stopped before seed 4's run alone began (and before the record was
  # written): the run alone that was begun keeps the model alone.
  (tmp_path / 'study' / 'lstm_s3-4' / 'diverged.json').unlink()
  shutil.rmtree(tmp_path / 'study' / 'lstm_s4')
  again = run_seed_study(study)
  assert len(stacks) == 1 and again[0] == rows[0]
  assert again[1]['test_perplexity'] == pytest.approx(rows[1]['test_perplexity'], rel=1e-12)


def _rms_dyneval(learning_rate=1e-2, members=1):
  from conftest import load_experiment

  rms = load_experiment('dyneval_rms', 'krause')
  rms.dynamic.update(learning_rate=(learning_rate,), decay=(1e-3,), ms_batches=2, ms_batch_size=4)
  rms.dynamic.members = members
  return rms


def test_a_studys_evaluations_score_every_run_and_are_read_back(held_stacks):
  """Dynamic evaluation of the stacked study's lstm runs: its static score of
  the same tokens is static evaluation at batch 1 of the whole split, its
  scores are kept beside each run and read back, and scored again when the
  evaluation changes (not `members`); a diverged evaluation is a data point."""
  from lm_zoo.configs import evaluation_config
  from lm_zoo.training import evaluate_workdir

  study, _, trained, _ = held_stacks
  study = study.copy_and_resolve_references()
  study.models = {'lstm': study.models.lstm}
  study.evaluations = {'rms': _rms_dyneval(members=0)}  # both seeds in one scan
  rows = run_seed_study(study)
  same = lambda r: (r['model'], r['seed'], r['workdir'], r['valid_perplexity'])
  assert [same(r) for r in rows] == [same(r) for r in trained if r['model'] == 'lstm']
  for row in rows:
    assert row['rms_settings']['learning_rate'] == 1e-2
    assert row['rms_test_perplexity'] != row['rms_test_static_perplexity']
  run = rows[1]  # seed 4
  static = evaluation_config('static')
  static.batch_size = 1
  for split, result in evaluate_workdir(run['workdir'], static).items():
    assert run[f'rms_{split}_static_perplexity'] == pytest.approx(result.perplexity, rel=1e-5)

  report = seed_report(rows, 'lstm', ['rms'])
  cells = [
    mean_and_spread([value(r) for r in rows])
    for value in (
      lambda r: r['rms_valid_static_perplexity'],
      lambda r: r['rms_valid_perplexity'],
      lambda r: r['rms_valid_static_perplexity'] - r['rms_valid_perplexity'],
    )
  ]
  assert (
    '| lstm | rms | 2 | valid | '
    + ' | '.join(f'{mean:.2f} ± {spread:.2f}' for mean, spread in cells)
    + ' |'
  ) in report

  stored = pathlib.Path(run['workdir']) / 'study_evaluations' / 'rms.json'
  kept = json.loads(stored.read_text())
  kept['scores']['test']['perplexity'] = 1.5
  stored.write_text(json.dumps(kept))
  study.evaluations = {'rms': _rms_dyneval(members=1)}
  assert run_seed_study(study)[1]['rms_test_perplexity'] == 1.5  # read back
  for learning_rate in (3e-3, 1.0):  # another setting; one that diverges
    study.evaluations = {'rms': _rms_dyneval(learning_rate)}
    study.evaluations.rms.splits = ('test',)
    again = run_seed_study(study)[1]
    assert 'rms_valid_perplexity' not in again
    if learning_rate < 1:
      assert again['rms_settings']['learning_rate'] == 3e-3 and again['rms_test_perplexity'] != 1.5
  assert again['rms_test_perplexity'] == math.inf and 'rms_settings' not in again
  assert 'diverged' in json.loads(stored.read_text())['scores']['test']['error']


@pytest.mark.parametrize(
  'name, evaluation, message',
  [
    ('dyn eval', 'rms', "'dyn eval' is not a name"),
    ('rms', None, 'config.evaluations.rms is not an evaluation config'),
    ('learned', 'learned', 'meta-trained first'),
    ('rms', 'bad_rule', 'dynamic.rule'),
  ],
)
def test_bad_evaluations_are_named_before_any_run(study, tmp_path, name, evaluation, message):
  import ml_collections

  from lm_zoo.configs import evaluation_config

  if evaluation == 'rms':
    evaluation = _rms_dyneval()
  elif evaluation == 'learned':
    evaluation = evaluation_config('learned')
  elif evaluation == 'bad_rule':
    evaluation = _rms_dyneval()
    evaluation.dynamic.rule = 'adam'
  else:
    evaluation = ml_collections.ConfigDict({'splits': ('valid',)})
  study.evaluations = {name: evaluation}
  with pytest.raises(ConfigError, match=message):
    run_seed_study(study)
  assert not (tmp_path / 'study').exists()


@pytest.mark.parametrize(
  'field, value, message',
  [
    ('reference', 'gru', 'config.reference'),
    ('seeds', (1, 1), 'distinct seeds'),
    ('seeds', (), 'distinct seeds'),
  ],
)
def test_bad_study_settings_are_named(study, field, value, message):
  study[field] = value
  with pytest.raises(ConfigError, match=message):
    run_seed_study(study)


def test_seeds_a_stack_cannot_train_are_named_before_any_run(study, tmp_path):
  study.stack = True
  study.seeds = (3, 5)
  with pytest.raises(
    ConfigError, match=r'^config.seeds must be consecutive and ascending .* got \[3, 5\]'
  ):
    run_seed_study(study)
  assert not (tmp_path / 'study').exists()


def test_experiment_models_share_the_budget_and_the_recipe():
  from conftest import load_experiment

  config = load_experiment('seed_study')
  models = config.models
  assert config.reference == 'lstm' and len(config.seeds) >= 3
  assert {models[m].model.param_budget for m in models if m != 'lstm_dual'} == {3_000_000}
  assert (
    models.mogrifier_r2.model.mogrifier.rounds,
    models.mogrifier_r5.model.mogrifier.rounds,
    models.mogrifier_lamb.model.mogrifier.rounds,
  ) == (2, 5, 5)
  assert (models.mlstm.model.cell, models.alstm.model.cell, models.alstm.model.alstm.latent) == (
    'mlstm',
    'alstm',
    'lstm',
  )
  assert models.lstm_dual.model.dual.size > 0
  lamb = models.mogrifier_lamb
  assert lamb.model.cap_input_gate and lamb.model.skip_connections and lamb.train.drop_state == 0.01
  # Apart from the model, every run trains with the same recipe.
  for m in models:
    assert models[m].optimizer == models.lstm.optimizer
    assert models[m].data == models.lstm.data
  for variant in ('models', 'lamb_features'):
    study = load_experiment('seed_study', variant)
    assert study.stack is False and list(study.seeds) == [0, 1, 2]


def test_lamb_feature_variant_adds_one_feature_at_a_time_to_the_same_runs():
  from conftest import load_experiment

  main, features = load_experiment('seed_study'), load_experiment('seed_study', 'lamb_features')
  assert features.reference == 'mogrifier_r5' and features.workdir == main.workdir
  # Shared names are the same runs, so both studies read them from one folder.
  for name in ('mogrifier_r5', 'mogrifier_lamb'):
    assert features.models[name] == main.models[name]
  base = features.models.mogrifier_r5
  for name, (field, value) in {
    'r5_cap_input_gate': ('model.cap_input_gate', True),
    'r5_skip_connections': ('model.skip_connections', True),
    'r5_drop_state': ('train.drop_state', 0.01),
  }.items():
    changed = features.models[name].copy_and_resolve_references()
    section, key = field.split('.')
    assert changed[section][key] == value
    changed[section][key] = base[section][key]
    assert changed == base
