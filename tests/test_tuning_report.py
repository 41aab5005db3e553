"""A study's report: the best trials in order, the neighbourhood of the best
(every hyper-parameter within 15% of its range, on the log scale for log
ranges) checked against a direct NumPy computation, and the figure; a
study's progress (its best so far) and reading it from a work directory."""

import sqlite3

import numpy as np
import optuna
import pytest

from lm_zoo.errors import ConfigError
from lm_zoo.tuning import (
  best_so_far,
  neighbourhood,
  param,
  read_study,
  tuning_config,
  write_report,
)
from lm_zoo.tuning.report import FIGURE_FILE, REPORT_FILE


@pytest.fixture
def study():
  """60 completed trials over a linear and a log range, the loss a bowl
  around (0.5, 1e-3), plus a pruned and a failed trial."""
  space = {
    'dropout': param('model.dropout_input', 0.0, 1.0),
    'lr': param('optimizer.learning_rate', 1e-5, 1e-1, log=True),
  }
  distributions = {
    'dropout': optuna.distributions.FloatDistribution(0.0, 1.0),
    'lr': optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True),
  }
  rng = np.random.default_rng(0)
  study = optuna.create_study(study_name='bowl')
  for dropout, log_lr in zip(rng.uniform(0, 1, 60), rng.uniform(-5, -1, 60)):
    loss = 4.0 + (dropout - 0.5) ** 2 + 0.1 * (log_lr + 3) ** 2
    study.add_trial(
      optuna.create_trial(
        params={'dropout': dropout, 'lr': 10**log_lr},
        distributions=distributions,
        value=loss,
        user_attrs={'perplexity': float(np.exp(loss))},
      )
    )
  study.add_trial(
    optuna.create_trial(
      state=optuna.trial.TrialState.PRUNED,
      params={'dropout': 0.5, 'lr': 1e-3},
      distributions=distributions,
      intermediate_values={1: 9.0},
    )
  )
  study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.FAIL))
  tune = tuning_config()
  tune.space.update(space)
  return study, tune


def test_neighbourhood_is_the_box_around_the_best(study):
  study, tune = study
  trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
  best = min(trials, key=lambda t: t.value)
  near = {t.number for t in neighbourhood(trials, best, tune.space, width=0.15)}
  x = np.array([[t.params['dropout'], np.log10(t.params['lr'])] for t in trials])
  centre = np.array([best.params['dropout'], np.log10(best.params['lr'])])
  inside = np.all(np.abs(x - centre) / np.array([1.0, 4.0]) <= 0.075, axis=1)
  assert near == {t.number for t, keep in zip(trials, inside) if keep}
  assert best.number in near
  wide = neighbourhood(trials, best, tune.space, width=2.0)
  assert len(wide) == len(trials)


def test_report_lists_the_best_trials_in_order_and_draws_them(study, tmp_path):
  study, tune = study
  text = write_report(study, tune, tmp_path, top=5)
  assert (tmp_path / REPORT_FILE).read_text() == text
  assert (tmp_path / FIGURE_FILE).stat().st_size > 0
  assert '61 finished trials (60 complete, 1 pruned), 1 failed' in text
  rows = [line for line in text.splitlines() if line.startswith('| ') and 'trial' not in line]
  values = [float(row.split('|')[2]) for row in rows]
  expected = sorted(t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
  np.testing.assert_allclose(values, expected[:5], atol=1e-4)
  assert f'valid loss {expected[0]:.4f}' in text


def test_a_dyneval_report_gives_the_evaluation_command(study, tmp_path):
  study, tune = study
  tune.kind, tune.dyneval.workdir = 'dyneval', 'runs/x'
  tune.space = {
    'lr': param('learning_rate', 1e-5, 1e-1, log=True),
    'dropout': param('segment_length', 0.0, 1.0),
  }
  best = min(
    (t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value
  )
  text = write_report(study, tune, tmp_path)
  command = next(line for line in text.splitlines() if 'lm-zoo-eval' in line)
  assert command.split()[:3] == [
    'lm-zoo-eval',
    '--workdir=runs/x',
    '--config=experiments/dyneval_rms.py',
  ]
  assert f'--config.dynamic.learning_rate={best.params["lr"]:.4g}' in command
  assert f'--config.dynamic.segment_length={best.params["dropout"]:.4g}' in command
  # The settings the space leaves out are the ones every trial ran with.
  assert '--config.dynamic.decay=0 ' in command and '--config.dynamic.eps=0.001' in command


def test_the_evaluation_command_scores_with_every_setting_the_trials_ran_with(study, tmp_path):
  """The command's config (its file with its flags applied) is the trials'
  dynamic section with the best trial's values: what is not searched and
  not the default (the RMS statistics' windows, the mean, the runs a scan)
  is in it too. Only search_tokens, which drives no search of one setting,
  is left to the file."""
  from conftest import load_experiment

  study, tune = study
  tune.kind, tune.dyneval.workdir = 'dyneval', 'runs/x'
  tune.space = {'lr': param('learning_rate', 1e-5, 1e-1, log=True), 'dropout': param('eps', 0, 1)}
  trials = tune.dyneval.evaluation.dynamic
  trials.update(rule='rms', decay=(1e-3,), search_tokens=200, ms_batches=2, ms_batch_size=4)
  trials.update(decay_mean='tensors', members=3, segment_length=(20,))
  text = write_report(study, tune, tmp_path)
  command = next(line for line in text.splitlines() if 'lm-zoo-eval' in line).split()
  config = load_experiment('dyneval_rms')
  assert command[2] == '--config=experiments/dyneval_rms.py'
  for flag in command[3:]:
    field, value = flag.removeprefix('--config.dynamic.').split('=')
    kind = type(config.dynamic[field])
    config.dynamic[field] = (
      tuple(type(config.dynamic[field][0])(v) for v in value.split(','))
      if kind is tuple
      else kind(value)
    )
  best = study.best_trial.params
  got, expected = config.dynamic.to_dict(), trials.to_dict() | {'search_tokens': 0}
  for field, name in (('learning_rate', 'lr'), ('eps', 'dropout')):
    assert got.pop(field) == pytest.approx((best[name],), rel=1e-3)
    del expected[field]
  assert got == expected


def test_best_so_far_is_the_running_minimum_over_finished_trials():
  """Pruned trials count as finished and change no best; failed ones count
  for nothing; the curve starts at the first complete trial."""
  complete, pruned, failed = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
  )
  states = [pruned, complete, failed, pruned, complete, complete, complete]
  losses = [None, 5.0, None, None, 4.0, 4.5, 3.9]
  study = optuna.create_study()
  for state, loss in zip(states, losses):
    study.add_trial(optuna.create_trial(state=state, value=loss))
  counts, values = best_so_far(study)
  finished = [s for s in states if s != failed]
  running = np.minimum.accumulate(
    [np.inf if v is None else v for s, v in zip(states, losses) if s != failed]
  )
  start = finished.index(complete)
  assert counts == list(range(start + 1, len(finished) + 1))
  np.testing.assert_allclose(values, np.exp(running[start:]))


def test_read_study_opens_the_one_study_of_a_tuning_workdir(tmp_path):
  tmp_path = tmp_path / 'a #1 ?%20'  # what a URI would read otherwise
  tmp_path.mkdir()
  with pytest.raises(ConfigError, match='study.db not found'):
    read_study(tmp_path)
  for content in (b'', b'not a database'):  # refused, and left as they were
    (tmp_path / 'study.db').write_bytes(content)
    with pytest.raises(ConfigError, match='not a study database'):
      read_study(tmp_path)
    assert (tmp_path / 'study.db').read_bytes() == content
  (tmp_path / 'study.db').write_bytes(b'')
  # Made a study database through a plain connection (a URL would misread the path).
  storage = optuna.storages.RDBStorage(
    'sqlite://', {'creator': lambda: sqlite3.connect(tmp_path / 'study.db')}
  )
  with pytest.raises(ConfigError, match='none started'):
    read_study(tmp_path)
  study = optuna.create_study(study_name='ptb_small_lstm', storage=storage)
  study.add_trial(optuna.create_trial(value=5.0))
  read = read_study(tmp_path)
  assert read.study_name == 'ptb_small_lstm' and [t.value for t in read.trials] == [5.0]
  optuna.create_study(study_name='another', storage=storage)
  with pytest.raises(ConfigError, match='holds 2 studies'):
    read_study(tmp_path)
  assert sorted(p.name for p in tmp_path.parent.iterdir()) == [tmp_path.name]
