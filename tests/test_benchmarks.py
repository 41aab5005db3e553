"""The speed benchmarks run end to end at a tiny size and write their JSON."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_lstm_lm_speed_writes_every_row_with_ratios(tmp_path):
  output = tmp_path / 'bench.json'
  subprocess.run([sys.executable, str(REPO / 'benchmarks' / 'lstm_lm_speed.py'), '--sizes=16',
                  '--vocab=50', '--batch_size=2', '--bptt=3', '--steps=1', '--rounds=1',
                  '--models=lstm,flax_lstm', f'--output={output}'],
                 check=True, capture_output=True, cwd=REPO)
  result = json.loads(output.read_text())
  assert result['malloc'] == 'retained' and result['matmul_peak_gflops'] > 0
  rows = {row['model']: row for row in result['results']}
  assert set(rows) == {'lstm', 'flax_lstm'}
  for row in rows.values():
    assert row['train_tokens_per_s'] == 6 / row['train_seconds']
    assert row['step_time_vs_lstm'] == row['train_seconds'] / rows['lstm']['train_seconds']
    assert row['train_ratio_vs_flax_lstm'] > 0
  assert 0 < rows['lstm']['fraction_of_matmul_peak']


def test_accelerator_speed_runs_on_a_cpu_with_the_gpu_rows_skipped(tmp_path):
  """The GPU benchmark at a tiny size: cuDNN's row is skipped with a message,
  and its code runs with jax.experimental.rnn's reference scan when asked."""
  output = tmp_path / 'bench.json'
  script = [sys.executable, str(REPO / 'benchmarks' / 'accelerator_speed.py'), '--tiny=16',
            '--steps=1', '--rounds=1', f'--output={output}']
  skipped = subprocess.run([*script, '--recipes=mogrifier_paper:ptb_mogrifier',
                            '--baselines=jax_cudnn_lstm,flax_lstm',
                            f'--profile_dir={tmp_path / "profile"}'],
                           check=True, capture_output=True, text=True, cwd=REPO)
  assert 'jax_cudnn_lstm: skipped, cuDNN runs on NVIDIA GPUs only' in skipped.stdout
  result = json.loads(output.read_text())
  rows = {row['row']: row for row in result['results']}
  assert set(rows) == {'mogrifier_paper:ptb_mogrifier', 'flax_lstm'}
  recipe = rows['mogrifier_paper:ptb_mogrifier']
  assert recipe['model'].startswith('Mogrifier lstm (5 rounds, rank 8)')
  # 1,000 turns of 200 updates of 4 x 5 tokens (the tiny batch), at the measured rate
  assert recipe['recipe_tokens'] == 200_000 * 4 * 5
  assert recipe['recipe_hours'] == recipe['recipe_tokens'] / recipe['train_tokens_per_s'] / 3600
  assert recipe['train_step_flops'] > 0 and result['recurrence_matmul_seconds'] > 0
  for row in rows.values():
    assert row['train_ratio_vs_flax_lstm'] == (row['train_tokens_per_s']
                                               / rows['flax_lstm']['train_tokens_per_s'])
  assert {p.name for p in (tmp_path / 'profile').iterdir()} == {
      'mogrifier_paper_ptb_mogrifier', 'flax_lstm'}

  subprocess.run([*script, '--recipes=mogrifier_paper:ptb_lstm', '--baselines=jax_cudnn_lstm',
                  '--cudnn_reference'], check=True, capture_output=True, cwd=REPO)
  rows = {row['row']: row for row in json.loads(output.read_text())['results']}
  assert 'reference scan' in rows['jax_cudnn_lstm']['library']
  assert rows['jax_cudnn_lstm']['train_tokens_per_s'] > 0
