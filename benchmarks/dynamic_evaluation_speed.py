"""Dynamic evaluation's tokens/s beside static evaluation's, in one run.

A 2-layer LSTM LM (vocab 10k) scores a random stream at batch 1, as the
papers evaluate: statically (`evaluate_stream`, windows of `--bptt`) and
dynamically (`dynamic_evaluate` with the SGD and RMS rules and the learned
rule of `GateNetwork` (8 hidden units), segments of `--segment` tokens, each
scored and then trained on), with its layers run each way of `--scans`
(`lm_zoo.cells.scans`: on a GPU 'fused', 'pallas', 'cudnn' and, with
`--dtype=bfloat16`, 'persistent' serve it as they serve training), its
products in `--dtype` (bfloat16: float32 sums, as `model.dtype` gives them;
the parameters and the rules' updates stay float32). Prints tokens/s, the
ratio to static evaluation and to the first scan's row of the same mode;
writes JSON. With `--profile_dir`, each row is traced once more, untimed,
and gives the device kernels a token (`profile_kernels_per_token`), the
fraction of the traced time the device was busy, and the 10 kernels that
took longest in all (`profile_top_kernels`; on a GPU only). A size and scan that fails is left
out with its reason (`failed`), and the script then exits with an error.
With `--members=1,8`, the SGD and RMS rows are also timed for 8 settings of
the rule scored at once (`dynamic_evaluate_many`) as a search scores them
with `dynamic.members` (one weights, their MS shared); such a row's
tokens/s counts every member's tokens.

  python benchmarks/dynamic_evaluation_speed.py [--sizes=200,650] [--tokens=2000]
      [--scans=fused,pallas,cudnn] [--rules=dynamic_sgd,dynamic_rms,learned_rule]
      [--dtype=float32] [--members=1]
"""

import json
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from baselines import row_failed
from device_traces import device_kernels, top_kernels

from lm_zoo.cells import LSTMCell
from lm_zoo.evaluation import (
  DynamicEvalSettings,
  DynamicMember,
  DynamicSetup,
  dynamic_evaluate,
  dynamic_evaluate_many,
  evaluate_stream,
  make_eval_step,
)
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.models.registry import DTYPES
from lm_zoo.optim import NUM_FEATURES, GateNetwork, dynamic_rms, dynamic_sgd, learned_update_rule
from lm_zoo.runtime import retain_host_memory

flags.DEFINE_list('sizes', ['200', '650'], 'Hidden (= embedding) sizes.')
flags.DEFINE_integer('vocab', 10_000, 'Vocabulary size.')
flags.DEFINE_integer('tokens', 2000, 'Length of the scored stream.')
flags.DEFINE_integer('segment', 5, 'Dynamic evaluation segment length.')
flags.DEFINE_integer('bptt', 35, 'Static evaluation window length.')
flags.DEFINE_list('scans', ['auto'], 'Ways to run the layers (lm_zoo.cells.SCANS).')
flags.DEFINE_enum('dtype', 'float32', list(DTYPES), "The products' operand dtype (model.dtype).")
RULES = ('dynamic_sgd', 'dynamic_rms', 'learned_rule')
flags.DEFINE_list(
  'rules',
  list(RULES),
  f'Dynamic evaluation rules timed beside static evaluation: any of {", ".join(RULES)}.',
)
flags.register_validator(
  'rules',
  lambda rules: bool(rules) and set(rules) <= set(RULES),
  f'choose one or more of {", ".join(RULES)}',
)
flags.DEFINE_list(
  'members', ['1'], 'How many settings of the SGD and RMS rules one scan scores, each a row.'
)
flags.register_validator(
  'members',
  lambda members: bool(members) and all(m.isdigit() and int(m) >= 1 for m in members),
  'give whole numbers >= 1',
)
flags.DEFINE_string('output', 'runs/bench_dynamic_evaluation.json', 'JSON results file.')
flags.DEFINE_string(
  'profile_dir',
  '',
  'Where to keep a jax.profiler trace of one more, untimed run of each row (empty: none).',
)
FLAGS = flags.FLAGS


def _tokens_per_second(fn) -> float:
  fn()  # compile
  start = time.perf_counter()
  fn()
  return FLAGS.tokens / (time.perf_counter() - start)


def profile(fn, name: str) -> dict:
  """The device kernels of one more run of `fn`, traced into
  --profile_dir/NAME; {} where the trace holds none (a CPU)."""
  trace_dir = os.path.join(FLAGS.profile_dir, name)
  jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
  jax.block_until_ready(fn())
  jax.profiler.stop_trace()
  traced = device_kernels(trace_dir)
  if not traced:
    return {}
  return {
    'profile_kernels_per_token': traced['kernels'] / FLAGS.tokens,
    'profile_device_busy': traced['busy_seconds'] / traced['span_seconds'],
    'profile_top_kernels': top_kernels(traced, FLAGS.tokens, 'token', 10),
  }


def measure(hidden: int, scan: str) -> list[dict]:
  dtype = DTYPES[FLAGS.dtype]
  model = RecurrentLM(
    Embedding(FLAGS.vocab, hidden, dtype=dtype),
    Stack([LSTMCell(hidden, dtype=dtype), LSTMCell(hidden, dtype=dtype)], scan=scan),
    Softmax(FLAGS.vocab, dtype=dtype),
  )
  params = init_params(model, jax.random.key(0))
  stream = np.random.default_rng(0).integers(0, FLAGS.vocab, FLAGS.tokens + 1).astype(np.int32)
  step = make_eval_step(model)
  rms = jax.tree.map(lambda p: np.full(p.shape, 1e-2, np.float32), params)
  # Built once: the scan is compiled for each transformation object.
  sgd, rms_rule = dynamic_sgd(1e-3), dynamic_rms(1e-4, 1e-3, 1e-3, rms)
  net = GateNetwork(hidden=8)
  learned = learned_update_rule(net.apply, rms)
  meta = {'meta_params': net.init(jax.random.key(1), jnp.zeros((1, NUM_FEATURES)))}
  runs = {
    'static': lambda: evaluate_stream(
      step, params, model.initialize_carry(1), stream, 1, FLAGS.bptt
    ),
    'dynamic_sgd': lambda: dynamic_evaluate(model, params, sgd, stream, FLAGS.segment),
    'dynamic_rms': lambda: dynamic_evaluate(model, params, rms_rule, stream, FLAGS.segment),
    'learned_rule': lambda: dynamic_evaluate(
      model, params, learned, stream, FLAGS.segment, extra_args=meta
    ),
  }
  timed = [(mode, 1, fn) for mode, fn in runs.items() if mode == 'static' or mode in FLAGS.rules]
  for count in sorted({int(m) for m in FLAGS.members} - {1}):
    for mode, rule in (('dynamic_sgd', 'sgd'), ('dynamic_rms', 'rms')):
      if mode in FLAGS.rules:
        timed.append((mode, count, _settings_at_once(model, params, rule, rms, stream, count)))
  rows = []
  for mode, count, fn in timed:
    rows.append(
      {
        'mode': mode,
        'members': count,
        'hidden': hidden,
        'scan': scan,
        'dtype': FLAGS.dtype,
        'tokens_per_s': count * _tokens_per_second(fn),
      }
    )
    if FLAGS.profile_dir:
      rows[-1].update(profile(fn, f'{mode}_x{count}_{hidden}_{scan}'))
  for row in rows:
    row['ratio_vs_static'] = row['tokens_per_s'] / rows[0]['tokens_per_s']
  return rows


def _settings_at_once(model, params, rule: str, ms, stream, count: int):
  """`count` settings of `rule` (learning rates 1e-4 to 1e-3) scored in one
  scan as a search scores them: held in the states of one transformation,
  whose inner state (the trained weights, MS) every setting shares."""
  setup = DynamicSetup(ms if rule == 'rms' else None)
  members = [
    DynamicMember(
      params,
      *setup.transformation(DynamicEvalSettings(rule, lr, 1e-3, 1e-3, FLAGS.segment), params),
    )
    for lr in np.geomspace(1e-4, 1e-3, count)
  ]
  return lambda: dynamic_evaluate_many(model, members, stream, FLAGS.segment)


def _with_ratios(rows: list[dict]) -> list[dict]:
  """`rows`, each with its tokens/s against the first scan's row of its mode,
  members and size."""
  same = lambda r: (r['mode'], r['members'], r['hidden'])
  return [
    {
      **row,
      'ratio_vs_first_scan': row['tokens_per_s']
      / next(r for r in rows if same(r) == same(row))['tokens_per_s'],
    }
    for row in rows
  ]


def _write(rows: list[dict], failed: dict) -> None:
  """The JSON output of the rows measured so far: a call cut short keeps them."""
  if FLAGS.output:
    path = pathlib.Path(FLAGS.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    results = {
      'device': str(jax.devices()[0]),
      'jax': jax.__version__,
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
      'results': _with_ratios(rows),
      'failed': failed,
    }
    path.write_text(json.dumps(results, indent=2))


def main(argv):
  del argv
  retain_host_memory()  # as lm_zoo's programs do
  rows, failed = [], {}
  for size in FLAGS.sizes:
    for scan in FLAGS.scans:
      print(f'hidden {size}, scan {scan}: compiling and timing', flush=True)  # a hang shows where
      try:
        rows += measure(int(size), scan)
      except Exception as err:  # any failure: this size and scan's reason, not the run's end
        row_failed(f'{size}@{scan}', err, failed)
      _write(rows, failed)
  print(
    f'devices: {jax.devices()}; vocab {FLAGS.vocab}, batch 1, {FLAGS.tokens} tokens, '
    f'segment {FLAGS.segment}, static window {FLAGS.bptt}, {FLAGS.dtype} products'
  )
  print(
    f'{"mode":>12} {"members":>7} {"hidden":>6} {"scan":>7} {"tokens/s":>10} {"vs static":>9} '
    f'{"vs " + FLAGS.scans[0]:>10}'
  )
  for r in _with_ratios(rows):
    print(
      f'{r["mode"]:>12} {r["members"]:>7} {r["hidden"]:>6} {r["scan"]:>7} '
      f'{r["tokens_per_s"]:>10,.0f} {r["ratio_vs_static"]:>9.2f} {r["ratio_vs_first_scan"]:>10.2f}'
    )
  if FLAGS.output:
    print(f'wrote {FLAGS.output}')
  if failed:
    raise SystemExit(
      f'error: {", ".join(failed)} failed (reasons above and in the output\'s "failed")'
    )


if __name__ == '__main__':
  app.run(main)
