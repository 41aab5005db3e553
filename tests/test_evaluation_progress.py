"""An evaluation of a work directory stopped after its choice or a split, and
started again, resumes with what it kept and ends with the results of one
never stopped; results read back from their record equal what was written."""

import json
import math

import numpy as np
import pytest

from lm_zoo.configs import evaluation_config
from lm_zoo.evaluation import Dynamic, EvalResult, Static, TunedTemperature
from lm_zoo.training import evaluate_workdir
from lm_zoo.training.evaluation_progress import EvaluationProgress, progress_digest


class Stopped(Exception):
  """Stands for a kill in the middle of an evaluation."""


def _dynamic_config(learning_rates=(0.01, 0.1), search_tokens=0):
  config = evaluation_config()
  config.evaluator = 'dynamic'
  config.dynamic.update(learning_rate=learning_rates, segment_length=(5,))
  config.dynamic.search_tokens = search_tokens
  return config


def _temperature_config():
  config = evaluation_config()
  config.evaluator = 'temperature'
  return config


def _as_json(results):
  return json.dumps({split: r.to_record() for split, r in results.items()}, sort_keys=True)


def test_a_record_reads_back_equal_arrays_and_infinities_included():
  details = {
    'settings': {'rule': 'rms', 'learning_rate': 1e-4},
    'search': [({'learning_rate': 0.1}, math.inf), ({'learning_rate': 0.01}, 4.25)],
    'segment_nll': np.array([1.5, 2.25], np.float32),
    'segment_tokens': np.array([5, 3], np.int32),
    'static_loss': 4.5,
  }
  result = EvalResult(4.123456789012345, 8, 'char', 0.9, details)
  read = EvalResult.from_record(json.loads(json.dumps(result.to_record())))
  assert read == result  # loss, tokens, unit and temperature (details compare apart)
  assert read.details['segment_nll'].dtype == np.float32
  np.testing.assert_array_equal(read.details['segment_nll'], details['segment_nll'])
  np.testing.assert_array_equal(read.details['segment_tokens'], details['segment_tokens'])
  assert read.details['search'][0] == [{'learning_rate': 0.1}, math.inf]
  assert read.details['settings'] == details['settings']


@pytest.mark.parametrize('make_config', [_dynamic_config, _temperature_config])
def test_stopped_after_the_first_split_resumes_without_choosing_again(
  trained_workdir, tmp_path, monkeypatch, make_config
):
  config = make_config()
  config.splits = ('valid', 'test')
  expected = evaluate_workdir(trained_workdir, config)
  evaluator = Dynamic if config.evaluator == 'dynamic' else TunedTemperature
  score = evaluator.score

  def stop_at_test(self, prepared, split):
    if split == 'test':
      raise Stopped
    return score(self, prepared, split)

  with monkeypatch.context() as patch:
    patch.setattr(evaluator, 'score', stop_at_test)
    with pytest.raises(Stopped):
      evaluate_workdir(trained_workdir, config, progress=tmp_path)
  [kept] = tmp_path.iterdir()
  assert sorted(p.name for p in kept.iterdir()) == ['choice.json', 'valid.json']

  def no_choosing(*args):
    raise AssertionError('chose again')

  scored = []
  monkeypatch.setattr(evaluator, 'prepare', no_choosing)
  monkeypatch.setattr(evaluator, 'score', lambda *a: scored.append(a[2]) or score(*a))
  resumed = evaluate_workdir(trained_workdir, config, progress=tmp_path)
  assert scored == ['test']
  assert list(resumed) == ['valid', 'test']
  assert _as_json(resumed) == _as_json(expected)
  assert not tmp_path.exists()  # removed once every split is scored


def test_stopped_after_the_search_scores_each_split_with_the_kept_choice(
  trained_workdir, tmp_path, monkeypatch
):
  """A search on part of valid: valid is scored again with the kept setting."""
  config = _dynamic_config(search_tokens=200)
  expected = evaluate_workdir(trained_workdir, config)
  with monkeypatch.context() as patch:
    patch.setattr(Dynamic, 'score', lambda *a: (_ for _ in ()).throw(Stopped))
    with pytest.raises(Stopped):
      evaluate_workdir(trained_workdir, config, progress=tmp_path)
  monkeypatch.setattr(Dynamic, 'prepare_many', lambda *a: pytest.fail('searched again'))
  resumed = evaluate_workdir(trained_workdir, config, progress=tmp_path)
  assert resumed['valid'].details['search'] == expected['valid'].details['search']
  assert _as_json(resumed) == _as_json(expected)


def test_another_config_weights_or_split_list_keeps_its_own_progress(trained_workdir, tmp_path):
  from lm_zoo.runs import load_trained

  run_config, corpus, _, params = load_trained(trained_workdir)
  key = lambda config, p=params: progress_digest(config, run_config, p, corpus.fingerprint())
  config = _dynamic_config()
  assert key(config) == key(_dynamic_config())
  only_valid = _dynamic_config()
  only_valid.splits = ('valid',)
  assert key(only_valid) == key(config)  # each split is kept alone
  assert key(_dynamic_config(learning_rates=(0.01, 0.3))) != key(config)
  other = {**params, 'extra': np.zeros(1, np.float32)}
  assert key(config, other) != key(config)
  moved = run_config.copy_and_resolve_references()
  moved.data.data_dir = f'{moved.data.data_dir}/./'  # the same data, named otherwise
  assert progress_digest(config, moved, params, corpus.fingerprint()) == key(config)


def _kept(workdir, parent, config):
  from lm_zoo.runs import load_trained

  run_config, corpus, _, params = load_trained(workdir)
  return EvaluationProgress.of(parent, config.evaluator, config, run_config, params, corpus)


@pytest.mark.parametrize(
  'make_config, name, text',
  [
    (evaluation_config, 'valid.json', '{"format": 1, "result": {"loss"'),
    (evaluation_config, 'test.json', '{"format": 0, "result": {}}'),
    (
      evaluation_config,
      'valid.json',
      '{"format": 1, "result": {"loss": "9.02", "num_tokens": 1, "unit": "word", '
      '"temperature": 1.0, "details": {}}}',
    ),
    (_temperature_config, 'choice.json', '{"format": 1, "choice": "abc"}'),
    (_temperature_config, 'choice.json', '{"format": 1, "choice": 40.0}'),
    (_dynamic_config, 'choice.json', '{"format": 1, "choice": [1, 2]}'),
    (_dynamic_config, 'choice.json', 'EPS_LEFT_OUT'),
  ],
)
def test_a_damaged_or_foreign_kept_record_is_made_again(
  trained_workdir, tmp_path, caplog, make_config, name, text
):
  config = make_config()
  expected = evaluate_workdir(trained_workdir, config)
  kept = _kept(trained_workdir, tmp_path, config)
  if text == 'EPS_LEFT_OUT':  # a real choice, less one of its settings
    with pytest.raises(Stopped):
      evaluate_workdir(trained_workdir, config, progress=tmp_path, store=_stop)
    for split in ('valid', 'test'):  # scored again, with the choice read back
      (kept.folder / f'{split}.json').unlink()
    record = json.loads((kept.folder / name).read_text())
    del record['choice']['settings']['eps']
    text = json.dumps(record)
  kept.check_writable()
  (kept.folder / name).write_text(text)
  resumed = evaluate_workdir(trained_workdir, config, progress=tmp_path)
  assert _as_json(resumed) == _as_json(expected)
  assert (
    'cannot be read' in caplog.text or 'the kept choice is none of this evaluator' in caplog.text
  )


def _stop(results):
  raise Stopped


def test_results_not_stored_keep_their_progress(trained_workdir, tmp_path, monkeypatch):
  config = _dynamic_config()
  with pytest.raises(Stopped):  # the results could not be written
    evaluate_workdir(trained_workdir, config, progress=tmp_path, store=_stop)
  monkeypatch.setattr(Dynamic, 'score', lambda *a: pytest.fail('scored again'))
  stored = []
  evaluate_workdir(trained_workdir, config, progress=tmp_path, store=stored.append)
  assert list(stored[0]) == ['valid', 'test'] and not tmp_path.exists()


def test_progress_that_cannot_be_kept_is_an_error_before_scoring(
  trained_workdir, tmp_path, monkeypatch
):
  from lm_zoo.errors import ConfigError

  blocked = tmp_path / 'progress'
  blocked.write_text('a file where the folder goes')
  monkeypatch.setattr(Dynamic, 'prepare_many', lambda *a: pytest.fail('searched first'))
  with pytest.raises(ConfigError, match=r'cannot keep its progress in .*progress/dynamic-\w+ '):
    evaluate_workdir(trained_workdir, _dynamic_config(), progress=blocked)


def test_static_scores_read_back_equal_the_evaluator(trained_workdir, tmp_path):
  from lm_zoo.runs import load_trained

  run_config, corpus, model, params = load_trained(trained_workdir)
  static = Static(run_config.data.bptt, run_config.data.test_batch_size)
  kept = EvaluationProgress(tmp_path / 'static')
  kept.save_result('valid', static(model, params, corpus, 'valid'))
  assert kept.result('valid') == static(model, params, corpus, 'valid')
  assert kept.result('test') is None
