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


def test_values_no_model_of_the_budget_takes_prune_their_trial_and_the_study_goes_on(
  tune, tmp_path
):
  """A parameter budget solved for a hidden size: the trial sampling a
  budget below the smallest model is pruned as infeasible, the next runs."""
  from lm_zoo.tuning import param

  tune.space = {'budget': param('model.param_budget', 1_000, 2_000_000, log=True)}
  tune.study.update(num_trials=2, startup_trials=2)
  study = open_study(tune, tmp_path)
  study.enqueue_trial({'budget': 1_000})  # below the 16-wide embedding of 10,000 words alone
  study.enqueue_trial({'budget': 400_000})
  run_worker(tune, tmp_path)
  infeasible, trained = sorted(study.trials, key=lambda t: t.number)
  assert infeasible.state == optuna.trial.TrialState.PRUNED
  assert 'is below the smallest model' in infeasible.user_attrs['infeasible']
  assert trained.state == optuna.trial.TrialState.COMPLETE


def test_a_base_config_no_trial_could_run_is_refused_before_the_study(tune, tmp_path):
  from lm_zoo.errors import ConfigError

  tune.base.model.hidden_size = 0
  with pytest.raises(ConfigError, match='model.hidden_size=0 must be at least 1'):
    run_worker(tune, tmp_path)
  assert not (tmp_path / 'study.db').exists()
