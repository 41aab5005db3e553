"""The speed benchmarks run end to end at a tiny size and write their JSON."""

import gzip
import json
import pathlib
import subprocess
import sys

import jax
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / 'benchmarks'))
from baselines import add_ratios, lstm_lm_matmul_params, row_failed  # noqa: E402
from device_traces import device_kernels, top_kernels  # noqa: E402
from optimized_hlo import loop_pads  # noqa: E402


def test_lstm_lm_speed_writes_every_row_with_ratios(tmp_path):
  output = tmp_path / 'bench.json'
  subprocess.run(
    [
      sys.executable,
      str(REPO / 'benchmarks' / 'lstm_lm_speed.py'),
      '--sizes=16',
      '--vocab=50',
      '--batch_size=2',
      '--bptt=3',
      '--steps=1',
      '--rounds=1',
      '--models=lstm,flax_lstm',
      f'--output={output}',
    ],
    check=True,
    capture_output=True,
    cwd=REPO,
  )
  result = json.loads(output.read_text())
  assert result['malloc'] == 'retained' and result['matmul_peak_gflops'] > 0
  rows = {row['model']: row for row in result['results']}
  assert set(rows) == {'lstm', 'flax_lstm'}
  for row in rows.values():
    assert row['train_tokens_per_s'] == 6 / row['train_seconds']
    assert row['step_time_vs_lstm'] == row['train_seconds'] / rows['lstm']['train_seconds']
    assert row['train_ratio_vs_flax_lstm'] > 0
  assert 0 < rows['lstm']['fraction_of_matmul_peak']


def test_accelerator_speed_compares_with_cudnn_s_reference_scan_on_a_cpu(tmp_path):
  """cuDNN's code runs with jax.experimental.rnn's reference scan when asked,
  and the recipe's row is given as a ratio of it. (The benchmark's rows
  skipped on a CPU: test_gpu_run_kit.py's test_the_kits_benchmark_skips_the_gpu_rows_on_a_cpu.)"""
  output = tmp_path / 'bench.json'
  script = [
    sys.executable,
    str(REPO / 'benchmarks' / 'accelerator_speed.py'),
    '--tiny=16',
    '--steps=1',
    '--rounds=1',
    f'--output={output}',
  ]
  subprocess.run(
    [
      *script,
      '--recipes=mogrifier_paper:ptb_lstm',
      '--scans=hoisted,fused',
      '--baselines=jax_cudnn_lstm',
      '--cudnn_reference',
      f'--hlo_dir={tmp_path}/hlo',
      '--unpadded',
      '--held',
    ],
    check=True,
    capture_output=True,
    cwd=REPO,
  )
  # The recipe rows' train steps as XLA optimized them: the window is a loop.
  hlos = {
    hlo.name.removeprefix('mogrifier_paper_ptb_lstm_'): hlo.read_text()
    for hlo in (tmp_path / 'hlo').iterdir()
  }
  assert sorted(hlos) == [
    'fused+held.hlo.txt',
    'fused+unpadded.hlo.txt',
    'fused.hlo.txt',
    'hoisted.hlo.txt',
  ]
  assert all(h.startswith('HloModule') and ' while(' in h for h in hlos.values())
  # the held twin's loops select the carry at every step
  assert hlos['fused+held.hlo.txt'].count(' select(') > hlos['fused.hlo.txt'].count(' select(')
  rows = {
    row['row'].removeprefix('mogrifier_paper:ptb_lstm'): row
    for row in json.loads(output.read_text())['results']
  }
  # the fused window's twins unpadded and held; cuDNN at the recipe's size, and 2x
  assert set(rows) == {
    '@hoisted',
    '@fused',
    '@fused+unpadded',
    '@fused+held',
    'jax_cudnn_lstm@16',
    'jax_cudnn_lstm@32',
  }
  assert rows['@fused+unpadded']['scan'] == 'fused'
  assert rows['@fused']['hlo_loop_pads'] == loop_pads(hlos['fused.hlo.txt'])
  recipe = rows['@hoisted']
  assert recipe['scan'] == 'hoisted'
  # the first calls compile: far longer than a step
  assert recipe['train_first_call_seconds'] > 3 * recipe['train_seconds']
  assert recipe['eval_first_call_seconds'] > 3 * recipe['eval_seconds']
  cudnn = rows['jax_cudnn_lstm@16']
  assert 'reference scan' in cudnn['library'] and cudnn['train_vs_cudnn'] == 1
  assert recipe['train_vs_cudnn'] == recipe['train_tokens_per_s'] / cudnn['train_tokens_per_s']
  assert recipe['eval_vs_cudnn'] == recipe['eval_tokens_per_s'] / cudnn['eval_tokens_per_s']
  # cuDNN's packed weights of two 16-unit layers, and an untied 16 x 50 softmax.
  from jax.experimental import rnn

  packed = rnn.init_lstm_weight(jax.random.key(0), 16, 16, 2, False).size
  assert cudnn['matmul_params'] == packed + 16 * 50 + 50
  assert lstm_lm_matmul_params(16, 50) == packed + 16 * 50 + 50


def test_device_kernels_counts_stream_kernels_and_their_busy_union(tmp_path):
  """A Perfetto trace as jax.profiler writes it on a GPU: only the device's
  stream events are kernels (host threads and other device lines are not),
  and overlapping kernels on two streams count once in the busy time."""
  meta = [
    {'ph': 'M', 'pid': 1, 'name': 'process_name', 'args': {'name': '/host:CPU'}},
    {'ph': 'M', 'pid': 1, 'tid': 10, 'name': 'thread_name', 'args': {'name': 'python'}},
    {'ph': 'M', 'pid': 2, 'name': 'process_name', 'args': {'name': '/device:GPU:0'}},
    {
      'ph': 'M',
      'pid': 2,
      'tid': 20,
      'name': 'thread_name',
      'args': {'name': 'Stream #14(Compute,Memset)'},
    },
    {
      'ph': 'M',
      'pid': 2,
      'tid': 21,
      'name': 'thread_name',
      'args': {'name': 'Stream #15(MemcpyH2D)'},
    },
    {'ph': 'M', 'pid': 2, 'tid': 22, 'name': 'thread_name', 'args': {'name': 'XLA Ops'}},
  ]
  x = lambda pid, tid, ts, dur, name='gemm': {
    'ph': 'X',
    'pid': pid,
    'tid': tid,
    'ts': ts,
    'dur': dur,
    'name': name,
  }
  events = [
    x(1, 10, 0, 1000),  # host: not a kernel
    x(2, 22, 0, 1000),  # an op line of the device: not a kernel
    x(2, 20, 100, 10),
    x(2, 20, 120, 20, 'pad'),
    x(2, 21, 130, 20, 'copy'),
    x(2, 20, 190, 10, 'pad'),
  ]
  # Busy: [100, 110) + [120, 150) + [190, 200) = 50 us of a 100 us span.
  folder = tmp_path / 'row' / 'plugins' / 'profile' / 'run'
  folder.mkdir(parents=True)
  with gzip.open(folder / 'perfetto_trace.json.gz', 'wt') as f:
    json.dump({'traceEvents': meta + events}, f)
  kernels = device_kernels(str(tmp_path / 'row'))
  assert kernels['kernels'] == 4
  assert kernels['busy_seconds'] == pytest.approx(50e-6)
  assert kernels['span_seconds'] == pytest.approx(100e-6)
  by_name = kernels['by_name']  # count and summed seconds, the longest first
  assert list(by_name) == ['pad', 'copy', 'gemm']
  assert by_name['pad'] == [2, pytest.approx(30e-6)]
  assert by_name['gemm'] == [1, pytest.approx(10e-6)]
  # The two longest over 2 traced steps: per step, and microseconds a launch.
  pad, copy = top_kernels(kernels, 2, 'step', 2)
  assert pad == {
    'name': 'pad',
    'per_step': 1.0,
    'us_per_step': pytest.approx(15.0),
    'us_each': pytest.approx(15.0),
  }
  assert copy['name'] == 'copy' and copy['us_per_step'] == pytest.approx(10.0)

  with gzip.open(folder / 'perfetto_trace.json.gz', 'wt') as f:  # a CPU run's trace
    json.dump({'traceEvents': meta[:2] + events[:1]}, f)
  assert device_kernels(str(tmp_path / 'row')) is None


def test_stacked_seeds_benchmark_refuses_an_empty_stack():
  """(Its timings at a tiny size: test_gpu_run_kit.py's
  test_the_kits_stacks_time_each_stack_against_a_run_alone.)"""
  refused = subprocess.run(
    [sys.executable, str(REPO / 'benchmarks' / 'stacked_seeds.py'), '--tiny=8', '--seeds=0,4'],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert refused.returncode != 0 and 'give stack sizes of at least 1' in refused.stderr


def test_loop_pads_finds_the_pads_inside_a_loop_and_no_other():
  """A pad of the carry inside a scan's body (at every step), beside one of
  the result after it: only the first is the loop's."""

  def program(weight, x):
    def step(h, _):
      padded = jax.numpy.pad(h, ((0, 0), (0, 3)))
      return jax.numpy.tanh(padded @ weight), None

    h, _ = jax.lax.scan(step, x, None, length=4)
    return jax.numpy.pad(h, ((0, 0), (0, 5)))

  weight, x = jax.numpy.ones((8, 5)), jax.numpy.ones((2, 5))
  hlo = jax.jit(program).lower(weight, x).compile().as_text()
  assert hlo.count(' pad(') == 2
  assert loop_pads(hlo) == ['f32[2,5]{1,0} -> f32[2,8]{1,0}']
  no_loop = jax.jit(lambda x: jax.numpy.pad(x, 1)).lower(x).compile().as_text()
  assert ' pad(' in no_loop and loop_pads(no_loop) == []


def test_each_row_is_compared_with_the_fastest_pytorch_row_of_its_dtype():
  """A bfloat16 recipe against the faster of autocast and the bfloat16
  module, a float32 one against float32; ratios of tokens/s."""

  def row(name, hidden, dtype, rate):
    return {
      'row': name,
      'hidden': hidden,
      'dtype': dtype,
      'train_tokens_per_s': rate,
      'eval_tokens_per_s': 2 * rate,
    }

  rows = [
    row('recipe', 8, 'float32', 300.0),
    row('recipe+bfloat16', 8, 'bfloat16', 390.0),
    row('jax_cudnn_lstm@8', 8, 'float32', 360.0),
    row('torch_lstm@8', 8, 'float32', 280.0),
    row('torch_lstm_bf16_autocast@8', 8, 'bfloat16', 380.0),
    row('torch_lstm_bf16@8', 8, 'bfloat16', 400.0),
    row('torch_lstm_fp16@8', 8, 'float16', 410.0),
    row('torch_lstm@16', 16, 'float32', 1.0),
  ]
  add_ratios(rows)
  recipe, narrow = rows[0], rows[1]
  assert recipe['train_vs_torch_same_dtype'] == 300 / 280
  assert narrow['train_vs_torch_same_dtype'] == 390 / 400
  assert narrow['eval_vs_torch_same_dtype'] == 780 / 800
  assert recipe['train_vs_torch_fastest'] == 300 / 410 and recipe['train_vs_cudnn'] == 300 / 360
  assert recipe['train_torch_fastest_row'] == 'torch_lstm_fp16@8'


def test_a_failed_row_keeps_its_whole_error_and_prints_its_traceback(capsys):
  """A kernel's compiler puts its diagnostics after the first line: the
  output keeps them, and the log has the traceback to debug it from."""
  failed = {}
  try:
    raise RuntimeError('Mosaic GPU lowering failed\nline 2: ptxas error\n')
  except RuntimeError as err:
    row_failed('lstm@persistent', err, failed)
  assert failed == {
    'lstm@persistent': 'RuntimeError: Mosaic GPU lowering failed\nline 2: ptxas error'
  }
  printed = capsys.readouterr().out
  assert printed.startswith('lstm@persistent: failed, RuntimeError: Mosaic GPU lowering failed\n')
  assert 'Traceback (most recent call last)' in printed and 'line 2: ptxas error' in printed
