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


def test_a_resumed_writer_hides_what_the_stopped_run_logged_past_its_checkpoint(tmp_path):
  first = MetricsWriter(tmp_path)
  for step in range(1, 9):
    first.write('train', step=step, loss=float(step))
  first.write('test', step=8, final=True, loss=3.0)
  first.close()  # stopped at step 8; its last checkpoint is step 5
  resumed = MetricsWriter(tmp_path, resume_step=5)
  for step in range(6, 10):
    resumed.write('train', step=step, loss=10.0 * step)
  resumed.close()
  steps = [(r['step'], r['loss']) for r in read_metrics(tmp_path / 'metrics.jsonl')]
  expected = [(s, float(s)) for s in range(1, 6)] + [(s, 10.0 * s) for s in range(6, 10)]
  assert steps == expected  # the final evaluation of the stopped run is gone too
  assert read_scalar_events(tmp_path / 'tensorboard')['train/loss'] == expected
  assert not read_scalar_events(tmp_path / 'tensorboard')['test_final/loss']
