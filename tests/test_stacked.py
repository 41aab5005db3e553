"""Seeds trained at once on the seed axis: each seed's run against the same
run trained alone, resuming, the seed work directories."""

import json
import math
import shutil
import signal

import jax
import numpy as np
import pytest
from conftest import read_events, tiny_lm_config

from lm_zoo.errors import ConfigError, Preempted, TrainingError
from lm_zoo.models import build_model, init_params
from lm_zoo.runs import Checkpoints, read_metrics
from lm_zoo.training import evaluate_workdir, loop, train_and_evaluate
from lm_zoo.training import state as train_state
from lm_zoo.training.seed_axis import check_num_seeds


def _best_params(config, workdir):
  model = build_model(config.model, 10_000)
  like = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  with Checkpoints(workdir) as checkpoints:
    return checkpoints.restore_best(like)


def _plateau(config):
  # Plateau drops follow each seed's own validation history: at this rate
  # seed 3 validates worse after epoch 2 than after epoch 1 and seed 4
  # better, so their rates for epoch 3 part ways, which the stack must follow.
  config.schedule.kind = 'plateau'
  config.optimizer.learning_rate = 10.0
  config.seed = 3
  return config


@pytest.fixture(scope='module')
def plateau_stack(data_dir, tmp_path_factory):
  """`plateau_config`'s seeds 3 and 4 trained at once (3 epochs), and each
  alone: (config, folder with stack/, alone_3/, alone_4/, stack summary,
  {seed: summary alone}). Tests read the folders, never train in them."""
  config = _plateau(tiny_lm_config(data_dir))
  folder = tmp_path_factory.mktemp('plateau')
  summary = train_and_evaluate(config, folder / 'stack', num_seeds=2)
  alone = {}
  for seed in (3, 4):
    single = config.copy_and_resolve_references()
    single.seed = seed
    alone[seed] = train_and_evaluate(single, folder / f'alone_{seed}')
  return config, folder, summary, alone


def test_each_seed_trains_the_run_it_would_train_alone(plateau_stack):
  plateau_config, tmp_path, summary, alone_summaries = plateau_stack
  assert summary['seeds'] == [3, 4]
  rates = {}
  for k, seed in enumerate((3, 4)):
    alone = plateau_config.copy_and_resolve_references()
    alone.seed = seed
    expected = alone_summaries[seed]
    run = summary['runs'][k]
    assert run['seed'] == seed
    assert run['best_epoch'] == expected['best_epoch']
    assert run['samples'] == expected['samples'] and len(run['samples']) == 1
    # Equal but for float32 rounding, which vmapped products order otherwise
    # and this high rate amplifies (to 1e-5 over 30 updates); seeds differ by
    # 10 to 60%.
    for split in ('valid', 'test'):
      np.testing.assert_allclose(run[split]['loss'], expected[split]['loss'], rtol=1e-4)
    alone_records = read_metrics(tmp_path / f'alone_{seed}' / 'metrics.jsonl')
    valid_curve = [
      math.exp(r['loss']) for r in alone_records if r['kind'] == 'valid' and not r.get('final')
    ]
    np.testing.assert_allclose(run['valid_curve'], valid_curve, rtol=1e-4)
    rates[seed] = [r['learning_rate'] for r in alone_records if r['kind'] == 'train']
    stack_rates = [
      r['learning_rate']
      for r in read_metrics(tmp_path / 'stack' / 'metrics.jsonl')
      if r['kind'] == 'train' and r['seed'] == seed
    ]
    assert stack_rates == rates[seed]
    # the seed's best weights, in its own work directory
    stacked, meta = _best_params(alone, tmp_path / 'stack' / f'seed_{seed}')
    single, single_meta = _best_params(alone, tmp_path / f'alone_{seed}')
    assert meta['epoch'] == single_meta['epoch']
    for x, y in zip(jax.tree.leaves(stacked), jax.tree.leaves(single)):
      np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-4)  # weights are O(0.1)
  assert len({tuple(r) for r in rates.values()}) > 1, 'the seeds should drop their rates apart'
  # The stack's summary: each split's mean and sample spread over the seeds.
  test = [math.exp(run['test']['loss']) for run in summary['runs']]
  assert summary['test']['mean'] == pytest.approx(np.mean(test), rel=1e-12)
  assert summary['test']['std'] == pytest.approx(np.std(test, ddof=1), rel=1e-12)
  assert json.loads((tmp_path / 'stack' / 'summary.json').read_text()) == summary


def test_each_seed_drops_its_own_carried_state_rows(tiny_config, tmp_path):
  """lamb's state drop (the seed study's mogrifier_lamb) under the stack: each
  seed zeroes the rows its run alone zeroes."""
  tiny_config.train.update(drop_state=0.3, num_epochs=1)
  tiny_config.generate.num_lines = 0
  second = train_and_evaluate(tiny_config, tmp_path / 'stack', num_seeds=2)['runs'][1]
  alone = tiny_config.copy_and_resolve_references()
  alone.seed = second['seed']  # not the stack's first: its draws are the stack's own
  expected = train_and_evaluate(alone, tmp_path / 'alone')['test']['loss']
  np.testing.assert_allclose(second['test']['loss'], expected, rtol=1e-5)
  alone.train.drop_state = 0.0
  kept = train_and_evaluate(alone, tmp_path / 'no_drop')['test']['loss']
  assert abs(kept - expected) > 1e-3  # the drop does act


def test_a_stopped_stack_resumes_as_if_it_had_not_stopped(plateau_stack, tmp_path):
  # Stopped at step 14 of 30, it resumes from step 7 across the epoch ends of
  # steps 10 and 20 (validation, carry reset, each seed's plateau drop).
  plateau_config, _, expected, _ = plateau_stack
  stopped = plateau_config.copy_and_resolve_references()
  stopped.train.max_steps = 14
  train_and_evaluate(stopped, tmp_path / 'stopped', num_seeds=2)
  # a kill after the save of step 14 reached disk only in part: the one of step 7 is used
  shutil.rmtree(tmp_path / 'stopped' / 'checkpoints' / '14')
  stopped.train.max_steps = 0
  resumed = train_and_evaluate(stopped, tmp_path / 'stopped', num_seeds=2)
  for a, b in zip(expected['runs'], resumed['runs']):
    assert a['valid_curve'] == b['valid_curve']
    assert a['test'] == b['test']
  records = read_metrics(tmp_path / 'stopped' / 'metrics.jsonl')
  train_steps = [(r['step'], r['seed']) for r in records if r['kind'] == 'train']
  assert train_steps == sorted(set(train_steps))  # nothing the lost stretch logged is kept
  # run again once finished: its summary, untouched
  assert train_and_evaluate(stopped, tmp_path / 'stopped', num_seeds=2) == resumed


def test_a_seed_work_directory_is_an_ordinary_run(plateau_stack):
  _, folder, summary, _ = plateau_stack
  tmp_path = folder / 'stack'
  for run in summary['runs']:
    folder = tmp_path / f'seed_{run["seed"]}'
    assert json.loads((folder / 'config.json').read_text())['seed'] == run['seed']
    scores = evaluate_workdir(folder)
    assert scores['test'].loss == pytest.approx(run['test']['loss'], rel=1e-9)
    assert json.loads((folder / 'summary.json').read_text()) == run
  # Each seed's samples in TensorBoard's text tab, under the seed's tag.
  texts = {
    value.tag: b''.join(value.tensor.string_val).decode()
    for event in read_events(tmp_path / 'tensorboard')
    for value in event.summary.value
    if value.metadata.plugin_data.plugin_name == 'text'
  }
  for run in summary['runs']:
    assert run['samples'][0] in texts[f'seed_{run["seed"]}/samples/text_summary']


@pytest.fixture(scope='module')
def signalled_stack(plateau_stack, tmp_path_factory):
  """`plateau_stack`'s stack, stopped by SIGTERM at step 8, then the same
  call resumed across the epoch ends of steps 10 and 20: (the stop's error,
  the latest checkpoint's step after it, the resumed summary, the resumed
  run's train steps)."""
  config = plateau_stack[0]
  workdir = tmp_path_factory.mktemp('signalled')
  original = loop.StopRequest.requested
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(
      loop.StopRequest,
      'requested',
      lambda self, step: signal.SIGTERM if step == 8 else original(self, step),
    )
    with pytest.raises(Preempted) as stopped:
      train_and_evaluate(config, workdir, num_seeds=2)
  with Checkpoints(workdir) as checkpoints:
    latest = checkpoints._latest.latest_step()
  steps = []
  make_train_step = loop.make_train_step
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(
      loop, 'make_train_step', lambda *a, **k: steps.append(make_train_step(*a, **k)) or steps[-1]
    )
    resumed = train_and_evaluate(config, workdir, num_seeds=2)
  return stopped.value, latest, resumed, steps


def test_a_signal_checkpoints_the_stack_and_the_same_call_resumes(signalled_stack, plateau_stack):
  stopped, latest, resumed, _ = signalled_stack
  assert 'SIGTERM received: training stopped at step 8' in str(stopped)
  assert latest == 8  # not a checkpoint_every step: the signal's own
  assert resumed['step'] == 30
  for alone, again in zip(plateau_stack[2]['runs'], resumed['runs']):  # never stopped
    assert again['valid_curve'] == alone['valid_curve']
    assert again['test'] == alone['test'] and again['best_epoch'] == alone['best_epoch']


@pytest.mark.parametrize('num_seeds', [0, -1, 1.5, True])
def test_a_bad_number_of_seeds_is_refused(num_seeds):
  with pytest.raises(ConfigError, match='num_seeds must be a whole number of at least 1'):
    check_num_seeds(num_seeds)


def test_a_stack_resumes_only_as_the_same_stack(plateau_stack):
  config, folder, _, _ = plateau_stack  # refused before anything is written there
  with pytest.raises(
    ConfigError,
    match=r'holds a stack of seeds \[3, 4\], not a stack of '
    r'seeds \[3, 4, 5\]: resume it with --seeds=2 and config.seed=3',
  ):
    train_and_evaluate(config, folder / 'stack', num_seeds=3)
  with pytest.raises(ConfigError, match=r'holds a stack of seeds \[3, 4\], not a run alone'):
    train_and_evaluate(config, folder / 'stack')
  with pytest.raises(
    ConfigError,
    match=r'holds a run alone, not a stack of seeds \[3, 4\]: '
    'resume it without --seeds',
  ):
    train_and_evaluate(config, folder / 'alone_3', num_seeds=2)


def test_a_resumed_stack_compiles_its_train_step_once(signalled_stack):
  # Restored arrays, the fresh carries of each epoch and each epoch's rates
  # must share one layout, or the step compiles again (2 s on the H200).
  *_, steps = signalled_stack  # the resumed run crosses an epoch end
  assert steps[0]._cache_size() == 1


def test_a_non_finite_seed_stops_the_stack_naming_it(tiny_config, tmp_path, monkeypatch):
  original = train_state.create_train_state

  def seed_1_broken(model, optimizer, config):
    state = original(model, optimizer, config)
    if config.seed == 1:
      state = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    return state

  monkeypatch.setattr(train_state, 'create_train_state', seed_1_broken)
  with pytest.raises(
    TrainingError,
    match=r'^seed 1: the training loss or gradient is not '
    r'finite at or before step 1 .*No checkpoint was written before '
    r'it',
  ) as stopped:
    train_and_evaluate(tiny_config, tmp_path, num_seeds=3)
  assert '\n' not in str(stopped.value)
  assert not list((tmp_path / 'checkpoints').glob('*'))
  nonfinite = [r for r in read_metrics(tmp_path / 'metrics.jsonl') if r['kind'] == 'nonfinite']
  assert [(r['step'], r['seed'], r['action']) for r in nonfinite] == [(1, 1, 'stop')]
