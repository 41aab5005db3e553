"""The GPU run kit (launch/gpu_run_kit.sh) at its tiny size on a CPU: every
part runs end to end and leaves its figures in the folder."""

import json
import math
import os
import subprocess

import pytest
from conftest import REPO
from warm_python import warm_python

from lm_zoo.runs import read_metrics

# Every part of the kit, once: each test below reads the figures of its parts.
KIT_PARTS = 'tests benchmark train kernels graphs agreement stacks seeds dyneval persistent'


@pytest.fixture(scope='module')
def kit(tmp_path_factory, data_dir):
  """launch/gpu_run_kit.sh, every part tiny, on a CPU, its $PYTHON a warm one
  (tests/warm_python.py): its OUT folder. SEEDS_ARGS adds flags to `seeds`."""
  out = tmp_path_factory.mktemp('kit') / 'out'
  env = {
    **os.environ,
    'KIT_TINY': '1',
    'KIT_PARTS': KIT_PARTS,
    'SEEDS_ARGS': '--seeds=3 --config.seed=5',
    'LM_ZOO_DATA': str(data_dir),
    'WHEELS': str(out.parent / 'no_wheels'),
  }
  with warm_python(env) as python:  # the kit's programs forked from one interpreter
    ran = subprocess.run(
      ['bash', 'launch/gpu_run_kit.sh', str(out)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
      env={**env, 'PYTHON': python},
    )
  assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
  return out


def test_the_kits_kernel_parts_check_time_and_compare_the_scans(kit):
  """The kit's 'kernels' and 'agreement' parts: the kernels' tests, the
  benchmark and dynamic evaluation under a scan, and two short trainings
  whose validation perplexities agree."""
  assert ' passed' in (kit / 'kernel_tests.txt').read_text()
  scans = {row['row'] for row in json.loads((kit / 'benchmark_scans.json').read_text())['results']}
  assert scans == {'mogrifier_paper:ptb_lstm@pallas'}
  dynamic = json.loads((kit / 'dynamic_evaluation.json').read_text())['results']
  assert {row['scan'] for row in dynamic} == {'pallas'}
  agreement = json.loads((kit / 'agreement.json').read_text())
  assert set(agreement) == {'ptb_lstm_small_py@fused', 'ptb_lstm_small_py@pallas'}
  fused, pallas = (
    agreement[f'ptb_lstm_small_py@{scan}']['valid_perplexity'] for scan in ('fused', 'pallas')
  )
  assert pallas == pytest.approx(fused, rel=1e-4)  # the same training, to float32 rounding


def test_the_kits_graphs_part_times_the_recipes_under_its_xla_flags(kit):
  """The 'graphs' part: the benchmark and dynamic evaluation, each process
  under XLA_FLAGS with the kit's command-buffer flags added (on a CPU XLA
  reads and ignores them)."""
  graphs = (
    '--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,'
    'DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL'
  )
  plain = json.loads((kit / 'benchmark_scans.json').read_text())
  assert graphs not in plain['xla_flags']
  for name, rows in (
    ('benchmark_graphs', {'mogrifier_paper:ptb_lstm'}),
    ('dynamic_evaluation_graphs', None),
  ):
    result = json.loads((kit / f'{name}.json').read_text())
    assert result['xla_flags'].endswith(' ' + graphs) and not result['failed']
    if rows:
      assert {row['row'] for row in result['results']} == rows
    else:
      assert {(row['mode'], row['scan']) for row in result['results']} == {
        ('static', 'fused'),
        ('dynamic_sgd', 'fused'),
      }


def test_the_kits_benchmark_skips_the_gpu_rows_on_a_cpu(kit):
  """The kit's accelerator benchmark at its tiny size: cuDNN's row is skipped
  with a message, and so is a way a recipe's layers cannot run."""
  out = (kit / 'benchmark.txt').read_text()
  assert 'jax_cudnn_lstm: skipped, cuDNN runs on NVIDIA GPUs only' in out
  assert (
    "mogrifier_paper:ptb_mogrifier@cudnn: skipped, model.scan='cudnn' cannot run Mogrify(LSTMCell)"
  ) in out
  result = json.loads((kit / 'benchmark.json').read_text())
  rows = {row['row']: row for row in result['results']}
  assert set(rows) == {
    'mogrifier_paper:ptb_mogrifier',
    'mogrifier_paper:ptb_mogrifier+bfloat16',
    'flax_lstm@16',
  }
  recipe = rows['mogrifier_paper:ptb_mogrifier']
  assert recipe['model'].startswith('Mogrifier lstm (5 rounds, rank 8)')
  # --bfloat16's twin: the recipe with bfloat16 products
  narrow = rows['mogrifier_paper:ptb_mogrifier+bfloat16']
  assert (recipe['dtype'], narrow['dtype']) == ('float32', 'bfloat16')
  assert narrow['model'] == recipe['model'] + ', bfloat16 products'
  # 1,000 turns of 200 updates of 4 x 5 tokens (the tiny batch), at the measured rate
  assert recipe['recipe_tokens'] == 200_000 * 4 * 5
  assert recipe['recipe_hours'] == recipe['recipe_tokens'] / recipe['train_tokens_per_s'] / 3600
  assert recipe['train_ms_per_step'] == pytest.approx(1e3 / recipe['train_tokens_per_s'] * 20)
  assert result['recurrence_matmul_seconds'] > 0
  # Tied: every parameter multiplies (the embedding as the softmax too); 6 FLOPs
  # per weight and token of a 4 x 5 window.
  from lm_zoo.experiments import mogrifier_paper
  from lm_zoo.models import build_model, count_params

  model = mogrifier_paper.get_config('ptb_mogrifier').model  # as --tiny=16 shrinks it
  model.update(param_budget=0, hidden_size=16, embed_size=16, embed_ratio=-1.0, output_size=0)
  model.mogrifier.rank = 8
  assert model.tie_embeddings
  assert recipe['train_step_flops'] == 6 * count_params(build_model(model, 50)) * 20
  # Untied (flax_lstm): the input embedding is only looked up.
  assert rows['flax_lstm@16']['matmul_params'] == 2 * (8 * 16 * 16 + 4 * 16) + 16 * 50 + 50
  for row in rows.values():  # no cuDNN nor PyTorch row to compare with
    assert 'train_vs_cudnn' not in row and 'train_vs_torch_fastest' not in row
  assert {p.name for p in (kit / 'profile').iterdir()} == {
    'mogrifier_paper_ptb_mogrifier',
    'mogrifier_paper_ptb_mogrifier+bfloat16',
    'flax_lstm_16',
  }


def test_the_kits_stacks_time_each_stack_against_a_run_alone(kit):
  """benchmarks/stacked_seeds.py as the kit's 'stacks' part runs it: a stack
  of 2 seeds of the tiny 4 x 5 batch, against a run alone."""
  alone, one, two = json.loads((kit / 'stacked_seeds.json').read_text())['results']
  assert (alone['seeds'], one['seeds'], two['seeds']) == ('alone', 1, 2)
  assert alone['per_seed_speedup'] == 1.0
  assert two['per_seed_speedup'] == 2 * alone['seconds_per_update'] / two['seconds_per_update']
  assert two['tokens_per_second'] == 2 * 4 * 5 / two['seconds_per_update']


def test_the_kits_dyneval_study_scores_each_seed_statically_and_dynamically(kit):
  """The `dyneval` part: the medium recipe's seeds (tiny) as one stack, then
  RMS and SGD dynamic evaluation of each, tabled beside the static score,
  then dynamic evaluation's speed with several runs a scan."""
  rows = json.loads((kit / 'dyneval.json').read_text())
  assert [(r['model'], r['seed']) for r in rows] == [('lstm_medium', 0), ('lstm_medium', 1)]
  for row in rows:
    assert row['workdir'].endswith(f'dyneval/lstm_medium_s0-1/seed_{row["seed"]}')
    for rule in ('rms', 'sgd'):
      # The static score of the same tokens is the run's own test score (batch 1).
      assert row[f'{rule}_test_static_perplexity'] == pytest.approx(
        row['test_perplexity'], rel=1e-5
      )
      assert math.isfinite(row[f'{rule}_test_perplexity'])
  report = (kit / 'dyneval.txt').read_text()
  assert '| lstm_medium | rms | 2 | test |' in report
  assert '| lstm_medium | sgd | 2 | test |' in report
  # then dynamic evaluation's speed with one run a scan and with 2
  speed = json.loads((kit / 'dyneval_members.json').read_text())
  assert not speed['failed']
  assert [(r['mode'], r['members']) for r in speed['results']] == [
    ('static', 1),
    ('dynamic_rms', 1),
    ('dynamic_rms', 2),
  ]


def test_the_kits_persistent_part_checks_the_kernel_interpreted(kit):
  """The `persistent` part first: the barrier alone, then
  benchmarks/persistent_probe.py --tiny, the kernels' modes interpreted
  (one block for the persistent ones), forward and forward plus backward,
  each checked against the reference (cuDNN's rows left out on a CPU), and
  the barrier's crossings; the Mogrifier kernels against the fused window,
  on their own grid and on one block (benchmarks/persistent_mogrifier_probe.py
  --tiny --blocks=1); then scan='persistent''s tests."""
  barrier = json.loads((kit / 'grid_barrier.json').read_text())
  assert [row['row'] for row in barrier['results']] == ['barrier_persistent']
  assert barrier['results'][0]['stale_blocks'] == 0 and not barrier['failed']
  result = json.loads((kit / 'persistent_probe.json').read_text())
  assert result['interpreted'] and not result['failed']
  assert result['sizes'] == {'hidden': 24, 'batch': 3, 'steps': 3}
  rows = {row['row']: row for row in result['results']}
  assert list(rows) == [
    'input_projection',
    'xla',
    'xla_bf16',
    'grad_xla',
    'grad_xla_bf16',
    'per_step',
    'no_barrier',
    'grad_per_step',
    'grad_no_barrier',
    'unfenced',
    'persistent',
    'grad_persistent',
    'barrier_no_barrier',
    'barrier_unfenced',
  ]  # not barrier_persistent again: grid_barrier.json has it
  rows['barrier_persistent'] = barrier['results'][0]
  for mode in ('no_barrier', 'unfenced', 'persistent'):
    crossings = rows[f'barrier_{mode}']
    assert crossings['rounds'] == 3 * 11 and crossings['stale_blocks'] == 0
    assert crossings['us_per_crossing'] == pytest.approx(1e3 * crossings['median_ms'] / 33)
  kernels = ('per_step', 'no_barrier', 'persistent')
  assert [rows[r]['blocks'] for r in kernels] == [4, 1, 1]
  assert [rows[f'grad_{r}']['blocks'] for r in kernels] == [4, 1, 1]
  assert rows['unfenced']['hs_max_abs_error_vs_bf16'] < 1e-5
  for name in kernels:
    assert rows[name]['hs_max_abs_error_vs_bf16'] < 1e-5
    assert 1e-5 < rows[name]['hs_max_abs_error_vs_f32'] < 1e-2  # bfloat16 products
    grads = rows[f'grad_{name}']
    assert grads['grad_max_rel_error_vs_bf16'] < 1e-5
    assert grads['grad_max_rel_error_vs_bf16'] >= grads['dU_max_rel_error_vs_bf16']
  assert 1e-4 < rows['grad_xla']['grad_max_rel_error_vs_bf16'] < 3e-2  # float32 products
  assert all(row['median_ms'] > 0 for row in rows.values())
  assert 'persistent ' in (kit / 'persistent_probe.txt').read_text()
  mogrifier = json.loads((kit / 'persistent_mogrifier_probe.json').read_text())
  assert mogrifier['interpreted'] and not mogrifier['failed']
  rows = {row['row']: row for row in mogrifier['results']}
  ways = ('fused', 'persistent', 'persistent_blocks1')  # the kernels' grid, then --blocks=1
  assert list(rows) == [f'{kind}_{way}' for kind in ('forward', 'grad') for way in ways]
  for name in rows:
    if 'persistent' in name:
      assert rows[name]['max_rel_error_vs_fused'] < 1e-5
  tests = (kit / 'persistent_tests.txt').read_text()
  assert ' passed' in tests and 'failed' not in tests


def test_the_kits_persistent_part_times_the_recipe_under_the_persistent_scan(kit):
  """Then the 24M LSTM recipe (tiny) with bfloat16 products under
  scan='persistent' (interpreted here; the tiny kit times 'auto' in its other
  parts), which runs bfloat16 products only: its float32 row is skipped with
  the fix, its bfloat16 twin timed."""
  result = json.loads((kit / 'benchmark_persistent.json').read_text())
  assert not result['failed']
  rows = {row['row']: row for row in result['results']}
  assert set(rows) == {'mogrifier_paper:ptb_lstm@persistent+bfloat16'}
  persistent = rows['mogrifier_paper:ptb_lstm@persistent+bfloat16']
  assert persistent['dtype'] == 'bfloat16' and persistent['train_tokens_per_s'] > 0
  out = (kit / 'benchmark_persistent.txt').read_text()
  assert "mogrifier_paper:ptb_lstm@persistent: skipped, model.scan='persistent'" in out
  assert 'set model.dtype=bfloat16' in out


def test_the_kits_persistent_part_times_dynamic_evaluation_with_bfloat16_products(kit):
  """Last, dynamic evaluation with bfloat16 products (the tiny kit times the
  fused row: an interpreted persistent one takes 15 s)."""
  result = json.loads((kit / 'dynamic_evaluation_persistent.json').read_text())
  assert not result['failed']
  rows = {(row['mode'], row['scan'], row['dtype']) for row in result['results']}
  assert rows == {('static', 'fused', 'bfloat16'), ('dynamic_sgd', 'fused', 'bfloat16')}


def test_the_gpu_run_kit_leaves_every_figure_in_its_folder(kit, tmp_path):
  """The kit's default parts: tests, benchmark (cuDNN's row skipped) and a few
  updates of the PTB Mogrifier recipe; and the parts the defaults leave out:
  stacks of seeds timed, and a stack trained."""
  assert {
    'devices.txt',
    'tests.txt',
    'benchmark.json',
    'benchmark.txt',
    'profile',
    'ptb_mogrifier.txt',
    'ptb_mogrifier',
  } <= {p.name for p in kit.iterdir()}
  assert ' passed' in (kit / 'tests.txt').read_text()
  assert 'jax_cudnn_lstm: skipped' in (kit / 'benchmark.txt').read_text()
  records = read_metrics(kit / 'ptb_mogrifier' / 'metrics.jsonl')
  assert any(r['kind'] == 'valid' and r.get('final') for r in records)

  # SEEDS_ARGS overrides the kit's own flags (its tiny size trains 2 seeds).
  summary = json.loads((kit / 'zaremba_medium' / 'summary.json').read_text())
  assert summary['seeds'] == [5, 6, 7] and summary['step'] == 4

  # A host lent for short spells runs the parts in turns; a misspelt part is
  # refused before anything runs.
  wrong = subprocess.run(
    ['bash', 'launch/gpu_run_kit.sh', str(tmp_path / 'wrong')],
    cwd=REPO,
    capture_output=True,
    text=True,
    env={**os.environ, 'KIT_PARTS': 'test'},
  )
  assert wrong.returncode == 2 and not (tmp_path / 'wrong').exists()
  assert wrong.stderr == (
    "error: KIT_PARTS: unknown part 'test'; "
    'choose from: tests benchmark train kernels graphs agreement stacks '
    'seeds dyneval mogrifier24m persistent\n'
  )
  wrong = subprocess.run(
    ['bash', 'launch/gpu_run_kit.sh', str(tmp_path / 'wrong')],
    cwd=REPO,
    capture_output=True,
    text=True,
    env={**os.environ, 'KIT_PARTS': 'seeds', 'SEEDS_SIZE': 'huge'},
  )
  assert wrong.returncode == 2 and not (tmp_path / 'wrong').exists()
  assert wrong.stderr == (
    "error: SEEDS_SIZE: unknown size 'huge'; choose from: small medium large\n"
  )


# A stand-in for the kit's $PYTHON: logs each command line; the barrier alone
# hangs (a `timeout` below 60 s stands for the kit's) or fails, and
# everything else ends.
_STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$KIT_LOG"
case "$*" in *--rows=barrier_persistent*) BARRIER;; esac
"""


def _persistent_part(tmp_path, barrier: str) -> tuple[subprocess.CompletedProcess, list[str]]:
  """The kit's persistent part run with the stand-in, its barrier step
  running `barrier`: (the kit's run, the command lines it ran)."""
  python, log, out = tmp_path / 'python', tmp_path / 'log', tmp_path / 'out'
  python.write_text(_STAND_IN.replace('BARRIER', barrier))
  python.chmod(0o755)
  kit = (REPO / 'launch' / 'gpu_run_kit.sh').read_text()
  assert kit.count('timeout -k 10 60 ') == 1
  (tmp_path / 'launch').mkdir()  # the copy runs in tmp_path, its root
  (tmp_path / 'launch' / 'gpu_run_kit.sh').write_text(
    kit.replace('timeout -k 10 60 ', 'timeout -k 1 2 ')
  )
  ran = subprocess.run(
    ['bash', str(tmp_path / 'launch' / 'gpu_run_kit.sh'), str(out)],
    cwd=REPO,
    capture_output=True,
    text=True,
    env={
      **os.environ,
      'PYTHON': str(python),
      'KIT_LOG': str(log),
      'KIT_PARTS': 'persistent',
      'WHEELS': str(tmp_path / 'no_wheels'),
    },
  )
  return ran, log.read_text().splitlines()


def test_where_the_barrier_alone_hangs_the_persistent_part_skips_what_crosses_it(tmp_path):
  """A grid barrier whose blocks are not all resident hangs every kernel that
  crosses it until that step's timeout: after the barrier's own check the
  probe leaves those rows out and the steps that need them do not run."""
  ran, calls = _persistent_part(tmp_path, 'exec sleep 60')
  out = tmp_path / 'out'
  assert ran.returncode == 1 and 'failed: grid_barrier' in ran.stderr
  assert calls[1].startswith('benchmarks/persistent_probe.py --rows=barrier_persistent')
  assert calls[2] == (
    f'benchmarks/persistent_probe.py --output={out}/persistent_probe.json '
    '--skip_rows=unfenced,persistent,grad_persistent,barrier_unfenced,barrier_persistent'
  )
  assert len(calls) == 3  # devices, the barrier, the probe: nothing after
  assert 'the barrier alone did not end' in (out / 'persistent_skipped.txt').read_text()


def test_a_barrier_probe_that_fails_without_hanging_leaves_the_rest_to_run(tmp_path):
  """A failure that is no hang (the probe's own error) is the barrier row's:
  every later step runs, and the probe does not time the barrier again."""
  ran, calls = _persistent_part(tmp_path, 'exit 1')
  out = tmp_path / 'out'
  assert ran.returncode == 1 and 'failed: grid_barrier' in ran.stderr
  assert calls[2] == (
    f'benchmarks/persistent_probe.py --output={out}/persistent_probe.json '
    '--skip_rows=barrier_persistent'
  )
  later = [call.split()[0] if call.split()[0] != '-m' else call.split()[1] for call in calls[3:]]
  assert later == [
    'benchmarks/persistent_mogrifier_probe.py',
    'benchmarks/accelerator_speed.py',
    'pytest',
    'benchmarks/dynamic_evaluation_speed.py',
  ]
  assert not (out / 'persistent_skipped.txt').exists()
