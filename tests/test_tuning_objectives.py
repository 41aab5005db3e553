"""What a training trial does (lm_zoo.tuning.objectives): it reports each
validation turn to the pruner, which can stop it there, and a run that
diverges is pruned and marked so."""

import optuna
import pytest
from tiny_tuning import load_tune_config, write_tune_file

from lm_zoo.tuning import open_study, run_worker


@pytest.fixture
def tune(tmp_path, data_dir):
  """The tiny tuning config, read from its file."""
  return load_tune_config(write_tune_file(tmp_path, data_dir))


def test_the_median_pruner_stops_a_trial_worse_than_the_first(tune, tmp_path):
  tune.study.update(num_trials=2, pruner='median', pruner_startup_trials=1)
  study = open_study(tune, tmp_path)
  study.enqueue_trial({'learning_rate': 1e-2, 'input_dropout': 0.0})
  study.enqueue_trial({'learning_rate': 1e-4, 'input_dropout': 0.5})  # barely learns
  run_worker(tune, tmp_path)
  good, bad = sorted(study.trials, key=lambda t: t.number)
  assert good.state == optuna.trial.TrialState.COMPLETE
  assert bad.state == optuna.trial.TrialState.PRUNED
  assert list(bad.intermediate_values) == [10]  # stopped at its first turn, of 2
  assert bad.intermediate_values[10] > good.intermediate_values[10]


def test_a_trial_whose_loss_overflows_the_perplexity_is_pruned_as_diverged(tune, tmp_path):
  tune.base.optimizer.update(name='sgd', clip_norm=0.0)
  tune.space.learning_rate.update(low=1e29, high=1e30)
  tune.study.num_trials = 1
  study = run_worker(tune, tmp_path)
  [trial] = study.get_trials(deepcopy=False)
  assert trial.state == optuna.trial.TrialState.PRUNED
  assert 'nats per token' in trial.user_attrs['diverged']
