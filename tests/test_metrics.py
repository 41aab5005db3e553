"""Metrics files and TensorBoard scalars."""

import pytest
from conftest import read_scalar_events

from lm_zoo.training.metrics import MetricsWriter, read_metrics


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


@pytest.mark.parametrize('keep', [5, -1], ids=['counted', 'uncounted checkpoint'])
def test_a_resumed_writer_hides_what_the_stopped_run_logged_past_its_checkpoint(tmp_path,
                                                                               keep):
  first = MetricsWriter(tmp_path)
  for step in range(1, 9):
    first.write('train', step=step, loss=float(step))
    if step == 5:
      assert first.count == 5  # what a checkpoint at step 5 stores
  first.write('test', step=8, final=True, loss=3.0)
  first.close()  # stopped at step 8; its last checkpoint is step 5
  resumed = MetricsWriter(tmp_path, keep=keep, resume_step=5)
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
      ('train', 1), ('train', 2), ('nonfinite', 5)]
  assert resumed.count == 3
  resumed.close()
  again = MetricsWriter(tmp_path)  # checkpoints deleted: a new run starts an empty log
  assert again.count == 0 and read_metrics(tmp_path / 'metrics.jsonl') == []
  again.close()
