"""Metrics files and TensorBoard scalars."""

import logging
import sys

import pytest
from conftest import read_events, read_scalar_events

from lm_zoo.configs import base_config
from lm_zoo.errors import ConfigError
from lm_zoo.runs.metrics import MetricsWriter, flat_fields, read_metrics


def test_records_are_json_lines_and_tensorboard_scalars(tmp_path):
  writer = MetricsWriter(tmp_path)
  for step in (5, 10):
    writer.write('train', step=step, epoch=1, loss=1.0 / step, learning_rate=0.5)
  writer.write('valid', step=10, epoch=1, averaged=False, perplexity=80.5)
  writer.write('test', step=10, final=True, perplexity=90.25, num_tokens=7)
  writer.close()
  records = read_metrics(tmp_path / 'metrics.jsonl')
  assert [r['kind'] for r in records] == ['train', 'train', 'valid', 'test']
  events = read_scalar_events(tmp_path / 'tensorboard')
  assert events['train/loss'] == [(5, pytest.approx(0.2)), (10, pytest.approx(0.1))]
  assert events['train/learning_rate'] == [(5, 0.5), (10, 0.5)]
  assert events['valid/perplexity'] == [(10, 80.5)]
  assert events['test_final/perplexity'] == [(10, 90.25)]
  # indices and flags are not scalars
  assert not {'train/step', 'train/epoch', 'valid/averaged', 'test_final/final'} & set(events)


def test_a_resumed_writer_hides_what_the_stopped_run_logged_past_its_checkpoint(tmp_path):
  first = MetricsWriter(tmp_path)
  for step in range(1, 9):
    first.write('train', step=step, loss=float(step))
    if step == 5:
      assert first.count == 5  # what a checkpoint at step 5 stores
  first.write('test', step=8, final=True, loss=3.0)
  first.close()  # stopped at step 8; its last checkpoint is step 5
  resumed = MetricsWriter(tmp_path, keep=5, resume_step=5)
  for step in range(6, 10):
    resumed.write('train', step=step, loss=10.0 * step)
  resumed.close()
  steps = [(r['step'], r['loss']) for r in read_metrics(tmp_path / 'metrics.jsonl')]
  expected = [(s, float(s)) for s in range(1, 6)] + [(s, 10.0 * s) for s in range(6, 10)]
  assert steps == expected  # the final evaluation of the stopped run is gone too
  assert read_scalar_events(tmp_path / 'tensorboard')['train/loss'] == expected
  assert not read_scalar_events(tmp_path / 'tensorboard')['test_final/loss']


def test_the_file_is_one_trajectory_after_a_torn_line_a_rollback_or_a_new_start(tmp_path):
  first = MetricsWriter(tmp_path)
  for step in range(1, 4):
    first.write('train', step=step, loss=1.0)
  first.close()
  with (tmp_path / 'metrics.jsonl').open('a') as f:
    f.write('{"kind": "valid", "st')  # a kill in the middle of a write
  resumed = MetricsWriter(tmp_path, keep=3, resume_step=3)
  resumed.write('valid', step=4, loss=2.0)
  assert [r['step'] for r in read_metrics(tmp_path / 'metrics.jsonl')] == [1, 2, 3, 4]
  resumed.write('train', step=5, loss=9.0)
  resumed.truncate(2)  # a rollback to a checkpoint that had logged two records
  resumed.write('nonfinite', step=5, action='rollback')
  assert [(r['kind'], r['step']) for r in read_metrics(tmp_path / 'metrics.jsonl')] == [
    ('train', 1),
    ('train', 2),
    ('nonfinite', 5),
  ]
  assert resumed.count == 3
  resumed.close()
  again = MetricsWriter(tmp_path)  # checkpoints deleted: a new run starts an empty log
  assert again.count == 0 and read_metrics(tmp_path / 'metrics.jsonl') == []
  again.close()


def _summary_values(logdir):
  """(tag, plugin name, text) of every summary value in a TensorBoard folder."""
  return [
    (
      value.tag,
      value.metadata.plugin_data.plugin_name,
      b''.join(value.tensor.string_val).decode() if value.HasField('tensor') else '',
    )
    for event in read_events(logdir)
    for value in event.summary.value
  ]


def test_the_config_and_samples_reach_tensorboard(tmp_path):
  config = base_config()
  config.model.mogrifier.rounds = 5
  writer = MetricsWriter(tmp_path)
  writer.hyperparameters(config)
  writer.text('samples', 'the cat sat', 30)
  writer.close()
  values = _summary_values(tmp_path / 'tensorboard')
  plugins = {plugin for _, plugin, _ in values}
  assert {'hparams', 'text'} <= plugins
  texts = {tag.split('/')[0]: text for tag, plugin, text in values if plugin == 'text'}
  assert 'the cat sat' in texts['samples']
  assert '"rounds": 5' in texts['config']
  start = next(
    v for v in _hparams_data(tmp_path / 'tensorboard') if v.HasField('session_start_info')
  )
  assert start.session_start_info.hparams['model.mogrifier.rounds'].number_value == 5
  assert start.session_start_info.hparams['model.cell'].string_value == 'lstm'
  assert flat_fields(config)['optimizer.learning_rate'] == config.optimizer.learning_rate


def _hparams_data(logdir):
  """The HParams plugin's data of every hparams summary in a TensorBoard folder."""
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

  return [
    HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for event in read_events(logdir)
    for value in event.summary.value
    if value.metadata.plugin_data.plugin_name == 'hparams'
  ]


def test_only_the_writing_process_writes_and_every_process_counts(tmp_path):
  """On many hosts, processes other than 0 write nothing, but their record
  counts (stored in checkpoints) agree with process 0's."""
  for folder in ('p0', 'p1'):
    (tmp_path / folder).mkdir()
  primary, other = MetricsWriter(tmp_path / 'p0'), MetricsWriter(tmp_path / 'p1', writes=False)
  for writer in (primary, other):
    writer.write('train', step=1, loss=1.0)
    writer.write('valid', step=1, perplexity=3.0)
    writer.text('samples', 'x', 1)
    writer.close()
  assert primary.count == other.count == 2
  assert (tmp_path / 'p0' / 'metrics.jsonl').exists() and (tmp_path / 'p0' / 'tensorboard').exists()
  assert not list((tmp_path / 'p1').iterdir())
  resumed = MetricsWriter(tmp_path / 'p1', keep=1, resume_step=1, writes=False)
  assert resumed.count == 1 and not list((tmp_path / 'p1').iterdir())


def test_without_tensorboardx_the_records_are_still_written(tmp_path, monkeypatch, caplog):
  monkeypatch.setitem(sys.modules, 'tensorboardX', None)  # as if not installed
  with caplog.at_level(logging.INFO, logger='lm_zoo'):
    writer = MetricsWriter(tmp_path)
  writer.write('train', step=1, loss=1.0)
  writer.hyperparameters(base_config())
  writer.close()
  assert [r['loss'] for r in read_metrics(tmp_path / 'metrics.jsonl')] == [1.0]
  assert not (tmp_path / 'tensorboard').exists()
  assert "pip install 'lm_zoo[tensorboard]'" in caplog.text


def test_a_log_deleted_under_a_resumed_run_is_reported(tmp_path, caplog):
  first = MetricsWriter(tmp_path)
  for step in range(1, 4):
    first.write('train', step=step, loss=1.0)
  first.close()
  (tmp_path / 'metrics.jsonl').unlink()
  with caplog.at_level(logging.WARNING, logger='lm_zoo'):
    resumed = MetricsWriter(tmp_path, keep=3, resume_step=3)
  resumed.close()
  assert 'metrics.jsonl holds 0 records where the checkpoint counted 3' in caplog.text


def test_a_damaged_line_inside_the_log_is_named_not_skipped(tmp_path):
  (tmp_path / 'metrics.jsonl').write_text(
    '{"kind": "train", "step": 1}\n[1, 2\n{"kind": "train", "step": 2}\n{"kind": "tr'
  )
  with pytest.raises(
    ConfigError,
    match=r'metrics.jsonl is damaged at line 2: .\[1, 2. is not '
    'a record',
  ):
    read_metrics(tmp_path / 'metrics.jsonl')
