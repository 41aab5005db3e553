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
