"""Training end to end on real PTB tokens: resume equivalence, metrics, errors."""

import json
import logging
import math
import shutil
import time

import jax
import numpy as np
import pytest
from conftest import read_scalar_events, tiny_lm_config

from lm_zoo.data import BatchedStream, load_data
from lm_zoo.errors import ConfigError, TrainingError
from lm_zoo.models import build_model
from lm_zoo.runs import read_metrics
from lm_zoo.runs.checkpoints import Checkpoints
from lm_zoo.training import (
  create_train_state,
  evaluate_workdir,
  loop,
  make_optimizer,
  train_and_evaluate,
)
from lm_zoo.training.budget import planned_steps


def _final_params(config, workdir):
  model = build_model(config.model, 10_000)
  like = create_train_state(model, make_optimizer(config.optimizer), config)
  state, meta = Checkpoints(workdir).restore_latest(like)
  return state, meta


@pytest.fixture(scope='module')
def resumed_runs(data_dir, tmp_path_factory):
  """One plateau run of 25 steps three ways: uninterrupted (full/), stopped at
  step 12 and resumed (split/), and killed at step 14 with only its
  checkpoint of step 12 kept, then resumed (killed/). Returns (config,
  folder, the train steps the resumed part of split/ built)."""
  # 10 windows an epoch, 3 epochs: 25 steps cross an epoch end (validation,
  # carry reset, plateau schedule) and stop mid-epoch; the resumed run finishes.
  # (Resuming variable-length windows is covered in test_batching.py.)
  config = tiny_lm_config(data_dir)
  config.schedule.kind = 'plateau'
  folder = tmp_path_factory.mktemp('resumed')
  full = config.copy_and_resolve_references()
  full.train.max_steps = 25
  train_and_evaluate(full, folder / 'full')

  half = config.copy_and_resolve_references()
  half.train.max_steps = 12
  train_and_evaluate(half, folder / 'split')
  half.train.max_steps = 25
  steps = []
  original = loop.make_train_step
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(
      loop, 'make_train_step', lambda *a, **k: steps.append(original(*a, **k)) or steps[-1]
    )
    train_and_evaluate(half, folder / 'split')

  # a kill: the run got to step 14 but only its checkpoint of step 12 survived
  killed = config.copy_and_resolve_references()
  killed.train.update(max_steps=14, checkpoint_every=3)
  train_and_evaluate(killed, folder / 'killed')
  shutil.rmtree(folder / 'killed' / 'checkpoints' / '14')
  killed.train.max_steps = 25
  train_and_evaluate(killed, folder / 'killed')
  return full, folder, steps


def test_interrupted_and_resumed_run_equals_uninterrupted(resumed_runs):
  full, tmp_path, _ = resumed_runs
  a, meta_a = _final_params(full, tmp_path / 'full')
  # Equal but for the wall time spent training, which the resumed runs add up.
  assert meta_a.pop('train_seconds') > 0
  for other in ('split', 'killed'):
    b, meta_b = _final_params(full, tmp_path / other)
    assert int(a.step) == int(b.step) == 25
    seconds_b = meta_b.pop('train_seconds')
    assert seconds_b > 0
    assert meta_a == meta_b
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(x, y)
    # the summary's training time is the whole run's, every process's part
    summary = json.loads((tmp_path / other / 'summary.json').read_text())
    assert summary['train_seconds'] >= round(seconds_b, 1) - 0.1
    # the metrics read as one run: no step logged twice, one final evaluation
    records = read_metrics(tmp_path / other / 'metrics.jsonl')
    train_steps = [r['step'] for r in records if r['kind'] == 'train']
    assert train_steps == sorted(set(train_steps)) == [5, 10, 15, 20, 25]
    assert sum(1 for r in records if r.get('final')) == 2


def test_a_resumed_run_compiles_its_train_step_once(resumed_runs):
  # Restored arrays, the fresh carries of each epoch and each epoch's rate
  # share one layout; before, a resumed run compiled its step three times.
  # The resumed part of split/ (steps 13 to 25) crosses the epoch end of step 20.
  *_, steps = resumed_runs
  assert steps[0]._cache_size() == 1


def test_stop_at_an_epoch_end_still_validates(tiny_config, tmp_path):
  tiny_config.train.max_steps = 10  # exactly one epoch of 10 windows
  summary = train_and_evaluate(tiny_config, tmp_path)
  records = read_metrics(tmp_path / 'metrics.jsonl')
  assert [r['epoch'] for r in records if r['kind'] == 'valid' and not r.get('final')] == [1]
  assert summary['best_epoch'] == 1


class _Stop(Exception):
  pass


def test_validation_turns_within_epochs_reach_the_callback_and_can_stop_the_run(
  tiny_config, tmp_path
):
  tiny_config.train.update(num_epochs=2, eval_every=4, max_steps=15)
  turns = []

  def record(step, epoch, result):
    turns.append((step, epoch, result.loss))

  summary = train_and_evaluate(
    tiny_config, tmp_path / 'full', on_validation=record, final_splits=('valid',)
  )
  # Every 4 steps, each epoch end (10 windows), and the step the budget stops at.
  assert [(s, e) for s, e, _ in turns] == [(4, 1), (8, 1), (10, 1), (12, 2), (15, 2)]
  valid = [
    r
    for r in read_metrics(tmp_path / 'full' / 'metrics.jsonl')
    if r['kind'] == 'valid' and not r.get('final')
  ]
  assert [r['loss'] for r in valid] == [loss for _, _, loss in turns]
  # The final score is the best turn's checkpoint, and test was left out.
  assert summary['valid']['loss'] == pytest.approx(min(loss for _, _, loss in turns), rel=1e-6)
  assert 'test' not in summary

  def stop_at_8(step, epoch, result):
    if step == 8:
      raise _Stop

  with pytest.raises(_Stop):
    train_and_evaluate(tiny_config, tmp_path / 'stopped', on_validation=stop_at_8)
  # The best weights of the turns before the stop are kept.
  assert {p.name for p in (tmp_path / 'stopped' / 'best').iterdir()} & {'4', '8'}


def test_a_wall_time_budget_stops_training_and_counts_the_resumed_runs(tiny_config, tmp_path):
  tiny_config.train.update(max_seconds=1e-6, eval_every=100)
  summary = train_and_evaluate(tiny_config, tmp_path / 'fresh')
  # Spent before the first update: the initial weights are scored, none kept as best.
  assert summary['step'] == 0 and summary['best_epoch'] is None
  assert math.isfinite(summary['valid']['loss'])
  # 5 steps take far more than a millisecond: resumed with that budget, the
  # run has none left.
  tiny_config.train.update(max_seconds=0.0, max_steps=5)
  train_and_evaluate(tiny_config, tmp_path / 'resumed')
  tiny_config.train.update(max_seconds=1e-3, max_steps=0)
  assert train_and_evaluate(tiny_config, tmp_path / 'resumed')['step'] == 5


@pytest.fixture(scope='module')
def finished_run(data_dir, tmp_path_factory):
  """`tiny_config` trained to its end (3 epochs, 30 steps): (config, work
  directory, summary). Tests read it, or are refused before writing to it."""
  config = tiny_lm_config(data_dir)
  workdir = tmp_path_factory.mktemp('finished')
  return config, workdir, train_and_evaluate(config, workdir)


def test_resuming_with_other_shapes_is_refused(finished_run):
  config, workdir, _ = finished_run
  config = config.copy_and_resolve_references()
  config.model.hidden_size = 24
  with pytest.raises(ConfigError, match='different model.hidden_size'):
    train_and_evaluate(config, workdir)


def test_run_writes_metrics_checkpoints_and_evaluates(finished_run):
  _, tmp_path, summary = finished_run
  records = read_metrics(tmp_path / 'metrics.jsonl')
  kinds = [r['kind'] for r in records]
  assert kinds.count('valid') == 3 + 1 and kinds[-2:] == ['valid', 'test']
  train = [r for r in records if r['kind'] == 'train']
  assert train[-1]['loss'] < train[0]['loss']
  assert all(r['tokens_per_second'] > 0 for r in train)
  assert summary['step'] == 30 and len(summary['samples']) == 1
  assert math.isclose(summary['test']['perplexity'], math.exp(summary['test']['loss']))
  # evaluate.py's path gives the same numbers from the best checkpoint
  results = evaluate_workdir(tmp_path)  # at the run's test batch size
  assert results['test'].loss == pytest.approx(summary['test']['loss'], rel=1e-6)
  assert json.loads((tmp_path / 'summary.json').read_text())['step'] == 30
  assert summary['tokens_per_second'] > 0
  assert summary['wall_seconds'] >= summary['train_seconds'] > 0
  events = read_scalar_events(tmp_path / 'tensorboard')
  assert [p for p, _ in events['valid/perplexity']] == [10, 20, 30]
  assert events['test_final/perplexity'] == [(30, pytest.approx(summary['test']['perplexity']))]


def test_the_logged_rate_leaves_out_checkpoint_saves(tiny_config, tmp_path, monkeypatch):
  """A line's tokens/s is its interval's training alone: a checkpoint saved
  inside the interval (here one that takes a second) is not counted."""
  saved = Checkpoints.save_latest

  def slow_save(self, *args, **kwargs):
    saved(self, *args, **kwargs)
    time.sleep(1.0)

  monkeypatch.setattr(Checkpoints, 'save_latest', slow_save)
  tiny_config.train.update(num_epochs=1, log_every=5, checkpoint_every=3)
  train_and_evaluate(tiny_config, tmp_path)
  train = [r for r in read_metrics(tmp_path / 'metrics.jsonl') if r['kind'] == 'train']
  tokens = 5 * tiny_config.data.batch_size * tiny_config.data.bptt  # a line's at most
  # Saves at steps 3, 6 and 9 fall inside the lines of steps 5 and 10; counting
  # one would cap their rate at `tokens` a second.
  assert [r['step'] for r in train] == [5, 10]
  assert all(r['tokens_per_second'] > 2 * tokens for r in train), train


def test_a_finished_run_run_again_is_left_as_it_is(tiny_config, tmp_path, caplog):
  """Not scored again, its summary's times kept, its command not added to
  the commands that trained it; more epochs train on from where it ended,
  and the summary's rate is the whole run's."""
  tiny_config.train.num_epochs = 1
  first = train_and_evaluate(tiny_config, tmp_path, command='lm-zoo-train one')
  metrics = (tmp_path / 'metrics.jsonl').read_text()
  with caplog.at_level(logging.INFO, logger='lm_zoo'):
    again = train_and_evaluate(tiny_config, tmp_path, command='lm-zoo-train again')
  assert again == first == json.loads((tmp_path / 'summary.json').read_text())
  assert (tmp_path / 'metrics.jsonl').read_text() == metrics  # nothing scored again
  assert 'already complete (10 steps, after epoch 1)' in caplog.text
  assert 'Resumed from step' not in caplog.text  # nothing to resume

  tiny_config.train.num_epochs = 2
  longer = train_and_evaluate(tiny_config, tmp_path, command='lm-zoo-train longer')
  assert longer['step'] == 20 and longer['train_seconds'] > first['train_seconds']
  commands = (tmp_path / 'commands.txt').read_text().splitlines()
  assert [line.split(': ', 1)[1] for line in commands] == [
    'lm-zoo-train one',
    'lm-zoo-train longer',
  ]
  _, meta = _final_params(tiny_config, tmp_path)
  tokens = 20 * tiny_config.data.batch_size * tiny_config.data.bptt
  assert meta['train_tokens'] == tokens
  # the rate of the same seconds the summary rounds to 0.1 s (a short run's
  # rounding alone moves it by a few percent)
  seconds = longer['train_seconds']
  assert (
    tokens / (seconds + 0.05) - 0.05
    <= longer['tokens_per_second']
    <= tokens / (seconds - 0.05) + 0.05
  )


def test_a_run_a_budget_ended_inside_an_epoch_says_where_when_run_again(
  tiny_config, tmp_path, caplog
):
  tiny_config.train.update(num_epochs=1, max_steps=3)  # an epoch is 10 updates
  train_and_evaluate(tiny_config, tmp_path)
  with caplog.at_level(logging.INFO, logger='lm_zoo'):
    train_and_evaluate(tiny_config, tmp_path)
  assert 'already complete (3 steps, in epoch 1)' in caplog.text


def test_variable_windows_compile_the_train_step_once_per_padded_length(
  tiny_config, tmp_path, monkeypatch
):
  """Windows of many lengths padded to multiples of 4 steps: a compile per
  multiple, not per length (each 2 to 3 s on a CPU, tens on a GPU)."""
  tiny_config.data.update(variable_bptt=True, pad_windows_to=4, train_tokens=201)
  tiny_config.train.num_epochs = 2
  tiny_config.generate.num_lines = 0
  steps = []
  original = loop.make_train_step
  monkeypatch.setattr(
    loop, 'make_train_step', lambda *a, **k: steps.append(original(*a, **k)) or steps[-1]
  )
  train_and_evaluate(tiny_config, tmp_path, final_splits=())
  batched = BatchedStream(load_data(tiny_config).train, tiny_config.data.batch_size)
  windows = [
    w
    for epoch in (1, 2)
    for w in batched.windows(
      10, variable=True, seed=(tiny_config.seed, epoch), pad_last=True, multiple=4
    )
  ]
  shapes = {w.inputs.shape for w in windows}
  assert steps[0]._cache_size() == len(shapes) < len({w.length for w in windows})


def test_planned_steps_are_the_steps_the_run_takes(tiny_config, tmp_path):
  # Variable BPTT draws each epoch's window lengths anew: the plan must too.
  tiny_config.data.update(variable_bptt=True, pad_windows_to=8)  # 2 shapes to compile
  # Rows of 25 tokens: epoch 1 draws 3 windows and epoch 2 draws 4; 2 x 3
  # fixed windows, or epoch 1's draw twice, would be 6 steps.
  tiny_config.data.train_tokens = 101
  tiny_config.train.num_epochs = 2
  tiny_config.generate.num_lines = 0
  batched = BatchedStream(load_data(tiny_config).train, tiny_config.data.batch_size)
  planned = planned_steps(tiny_config, batched)
  assert train_and_evaluate(tiny_config, tmp_path)['step'] == planned
  assert planned != 6
  tiny_config.train.max_steps = 4
  assert planned_steps(tiny_config, batched) == 4


def test_non_finite_loss_stops_with_a_clear_error(tiny_config, tmp_path):
  tiny_config.optimizer.learning_rate = 1e38  # finite, and the first update overflows
  with pytest.raises(TrainingError, match='not finite at or before step') as stopped:
    train_and_evaluate(tiny_config, tmp_path)
  assert not list((tmp_path / 'checkpoints').glob('*'))  # no broken checkpoint
  # and the advice does not send the user to one
  assert 'No checkpoint was written before it' in str(stopped.value)
  assert 'resume from it' not in str(stopped.value)
