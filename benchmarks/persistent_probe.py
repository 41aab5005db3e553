"""The persistent Mosaic GPU LSTM kernel (lm_zoo.kernels.persistent_lstm) on a
GPU: is it right, and how fast is one window's forward pass beside XLA's and
cuDNN's?

At the 24M LSTM recipe's size (hidden 951, batch 64, 70 steps; the kernel
pads to 960 units in 120 blocks) it checks each of the kernel's modes
against `lstm_recurrence` (`f32`: float32 products at 'highest' precision;
`bf16`: bfloat16 operands summed in float32, as the kernel multiplies; max
abs and relative error of the outputs h_1..h_T and of c_T),
then times a window's forward pass (median of --runs after --warmup, each
call waited for with `jax.block_until_ready`):

- persistent: the one-launch kernel with its semaphore barrier a step;
- no_barrier: the same without the barrier (wrong answers: what it costs);
- per_step: the same kernel launched once a step (the launch is the barrier);
- xla / xla_bf16: `lstm_recurrence` under jit, float32 (JAX's default
  precision: TF32 on NVIDIA GPUs) / bfloat16 products;
- input_projection: P = x W + b, which the kernels above take precomputed;
- cudnn: cuDNN's LSTM layer (`lm_zoo.cells.cudnn_lstm`, float32 or TF32
  products, its input projection included), on NVIDIA GPUs only.

Rows are measured from the surest to the least sure, the persistent kernel
last, and the JSON (--output) is rewritten after each: a kernel that hangs
(its blocks not all resident) leaves every figure before it. A row that
fails is left out with its reason (`failed`), and the script then exits with
an error. --tiny runs it at a tiny size in Pallas' GPU interpreter on any
machine, the persistent modes in one block (the interpreter has no
semaphores): a check that the script runs, not a speed.

  python benchmarks/persistent_probe.py [--output=runs/persistent_probe.json]
      [--hidden=951 --batch=64 --steps=70 --blocks=N --runs=20] [--tiny]
"""

import functools
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags
from baselines import failure_reason

from lm_zoo.cells import LSTMCell
from lm_zoo.cells.cudnn_lstm import cudnn_lstm_window
from lm_zoo.cells.lstm_recurrence import lstm_recurrence
from lm_zoo.kernels.persistent_lstm import layout_for, persistent_lstm_forward

flags.DEFINE_integer('hidden', 951, 'Hidden size n (the input size too).')
flags.DEFINE_integer('batch', 64, 'Batch size (at most 64).')
flags.DEFINE_integer('steps', 70, 'Window length T.')
flags.DEFINE_integer('blocks', None, "The kernel's blocks (default: one per 8 units).")
flags.DEFINE_integer('runs', 20, 'Timed runs per row (their median is reported).')
flags.DEFINE_integer('warmup', 3, 'Untimed runs per row after compiling.')
flags.DEFINE_bool('tiny', False, 'Hidden 24, batch 3, 3 steps, interpreted: checks the script.')
flags.DEFINE_string('output', 'runs/persistent_probe.json', 'JSON results file.')
FLAGS = flags.FLAGS


def _interpret_params():
  """Pallas' Mosaic GPU interpreter (not public in jax 0.10)."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  return InterpretGPUParams()


def _inputs(hidden: int, batch: int, steps: int):
  """x (T, B, n), W (n, 4n), b, U (n, 4n) scaled as an LSTM's at init, h0, c0."""
  keys = jax.random.split(jax.random.key(0), 6)
  scale = hidden**-0.5
  x = jax.random.normal(keys[0], (steps, batch, hidden))
  w = scale * jax.random.normal(keys[1], (hidden, 4 * hidden))
  b = 0.1 * jax.random.normal(keys[2], (4 * hidden,))
  u = scale * jax.random.normal(keys[3], (hidden, 4 * hidden))
  h0 = jnp.tanh(jax.random.normal(keys[4], (batch, hidden)))
  c0 = jax.random.normal(keys[5], (batch, hidden))
  return x, w, b, u, h0, c0


def _median_ms(fn, args) -> dict:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  for _ in range(FLAGS.warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(FLAGS.runs):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return {'median_ms': 1e3 * statistics.median(times), 'first_call_s': first}


def _errors(got, want) -> dict:
  """Max abs and relative (to the largest |want|) error of hs and c_T."""
  (c, _), hs = got
  (want_c, _), want_hs = want
  out = {}
  for name, a, b in (('hs', hs, want_hs), ('c', c, want_c)):
    diff = float(jnp.max(jnp.abs(a - b)))
    out[f'{name}_max_abs_error'] = diff
    out[f'{name}_max_rel_error'] = diff / max(float(jnp.max(jnp.abs(b))), 1e-30)
  return out


def _cudnn(hidden: int):
  """cuDNN's layer of our LSTMCell's parameters: (x, W, b, U, h0, c0) -> ((c, h), hs)."""
  if jax.default_backend() != 'gpu':
    return None
  cell = LSTMCell(hidden)

  def run(x, w, b, u, h0, c0):
    params = {'input': {'kernel': w, 'bias': b}, 'recurrent_kernel': u}
    return cudnn_lstm_window(cell, params, (c0, h0), x)

  return jax.jit(run)


def _rows(sizes, interpret):
  """name -> (the function of (x, W, b, U, h0, c0), whether to check it, the
  kernel's blocks or None), surest first."""
  project = lambda x, w, b: x @ w + b
  reference = lambda dtype: (
    lambda x, w, b, u, h0, c0: lstm_recurrence(project(x, w, b), u, (c0, h0), dtype=dtype)
  )

  def kernel(mode, blocks):
    run = functools.partial(persistent_lstm_forward, mode=mode, blocks=blocks, interpret=interpret)
    return lambda x, w, b, u, h0, c0: run(project(x, w, b), u, h0, c0)

  # Interpreted, a persistent grid has one block (no semaphores there).
  one = 1 if interpret is not None else FLAGS.blocks
  grid = lambda blocks: layout_for(sizes['batch'], sizes['hidden'], blocks).blocks
  rows = {
    'input_projection': (lambda x, w, b, *_: project(x, w, b), False, None),
    'xla': (reference(jnp.float32), False, None),
    'xla_bf16': (reference(jnp.bfloat16), False, None),
    'cudnn': (_cudnn(sizes['hidden']), True, None),
    'per_step': (kernel('per_step', FLAGS.blocks), True, grid(FLAGS.blocks)),
    'no_barrier': (kernel('no_barrier', one), True, grid(one)),
    'persistent': (kernel('persistent', one), True, grid(one)),
  }
  return {name: (jax.jit(fn), *rest) for name, (fn, *rest) in rows.items() if fn is not None}


def _measure(name, fn, check, blocks, args, wants) -> dict:
  row = {'row': name, **({'blocks': blocks} if blocks else {}), **_median_ms(fn, args)}
  if check:
    got = fn(*args)
    for ref, want in wants.items():
      row.update({f'{key}_vs_{ref}': value for key, value in _errors(got, want).items()})
  return row


def _write(result: dict):
  path = pathlib.Path(FLAGS.output)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=2))


def _print_table(result: dict):
  print(f'{"row":>17} {"median ms":>10} {"us/step":>8} {"hs err vs f32":>14} {"vs bf16":>12}')
  for r in result['results']:
    errors = [r.get(f'hs_max_abs_error_vs_{ref}') for ref in ('f32', 'bf16')]
    shown = ' '.join(f'{e:>{w}.2e}' if e is not None else ' ' * w for e, w in zip(errors, (14, 12)))
    per_step = 1e3 * r['median_ms'] / result['sizes']['steps']
    print(f'{r["row"]:>17} {r["median_ms"]:>10.3f} {per_step:>8.2f} {shown}')
  for name, reason in result['failed'].items():
    print(f'{name:>17} failed: {reason}')


def main(argv):
  del argv
  if FLAGS.tiny:
    FLAGS.hidden, FLAGS.batch, FLAGS.steps, FLAGS.runs, FLAGS.warmup = 24, 3, 3, 1, 0
  if not FLAGS.tiny and jax.default_backend() != 'gpu':
    raise SystemExit('error: the probe times a GPU kernel; --tiny runs it interpreted elsewhere')
  interpret = _interpret_params() if FLAGS.tiny else None
  sizes = {'hidden': FLAGS.hidden, 'batch': FLAGS.batch, 'steps': FLAGS.steps}
  layout = layout_for(FLAGS.batch, FLAGS.hidden, FLAGS.blocks)
  device = jax.devices()[0]
  result = {
    'device': str(device),
    'device_kind': device.device_kind,
    'sm_count': getattr(device, 'core_count', None),
    'jax': jax.__version__,
    'interpreted': interpret is not None,
    'sizes': sizes,
    'layout': {
      'rows': layout.rows,
      'units': layout.units,
      'blocks': layout.blocks,
      'block_units': layout.block_units,
      'smem_bytes': layout.smem_bytes,
    },
    'results': [],
    'failed': {},
  }
  args = _inputs(**sizes)
  rows = _rows(sizes, interpret)
  with jax.default_matmul_precision('highest'):  # float32 products exact, not TF32
    wants = {'f32': rows['xla'][0](*args)}
  wants['bf16'] = rows['xla_bf16'][0](*args)
  print(f'{device.device_kind}, jax {jax.__version__}; {sizes}; layout {result["layout"]}')
  for name, (fn, check, blocks) in rows.items():
    try:
      result['results'].append(_measure(name, fn, check, blocks, args, wants))
      print(f'{name}: {result["results"][-1]["median_ms"]:.3f} ms', flush=True)
    except Exception as err:  # any failure: this row's reason, not the run's end
      result['failed'][name] = failure_reason(err)
      print(f'{name}: failed, {result["failed"][name]}', flush=True)
    _write(result)
  _print_table(result)
  print(f'wrote {FLAGS.output}')
  if result['failed']:
    raise SystemExit(f'error: {", ".join(result["failed"])} failed (reasons above)')


if __name__ == '__main__':
  app.run(main)
