"""The persistent Mosaic GPU LSTM kernels (lm_zoo.kernels.persistent_lstm and
persistent_lstm_backward) on a GPU: are they right, and how fast are one
window's forward pass, and its forward and backward passes, beside XLA's and
cuDNN's?

At the 24M LSTM recipe's size (hidden 951, batch 64, 70 steps; the kernel
pads to 960 units in 120 blocks) it checks each of the kernel's modes
against `lstm_recurrence` (`f32`: float32 products at 'highest' precision;
`bf16`: bfloat16 operands summed in float32, as the kernel multiplies; max
abs and relative error of the outputs h_1..h_T and of c_T),
then times a window's forward pass (median of --runs after --warmup, each
call waited for with `jax.block_until_ready`):

- persistent: the one-launch kernel with its barrier a step (a semaphore
  and proxy fences, `lm_zoo.kernels.grid_barrier`);
- unfenced: the same without the proxy fences (if its answers are right,
  what the fences cost; if wrong, they were needed);
- no_barrier: the same without the barrier (wrong answers: what it costs);
- per_step: the same kernel launched once a step (the launch is the barrier);
- xla / xla_bf16: `lstm_recurrence` under jit, float32 (JAX's default
  precision: TF32 on NVIDIA GPUs) / bfloat16 products;
- input_projection: P = x W + b, which the kernels above take precomputed;
- cudnn: cuDNN's LSTM layer (`lm_zoo.cells.cudnn_lstm`, float32 or TF32
  products, its input projection included), on NVIDIA GPUs only.

The grad_* rows time a training step's share of the same window: the value
and gradients (W, b, U, h_0, c_0) of L = Σ_t hs_t ⊙ R (R a fixed random
cotangent) under one jit, the projection P = x W + b included:
grad_xla / grad_xla_bf16 (`lstm_recurrence`'s hand-written backward),
grad_cudnn, and grad_per_step / grad_no_barrier / grad_persistent
(`lm_zoo.cells.persistent_lstm.persistent_lstm_recurrence`: both passes as
persistent kernels in that mode). Each is checked against grad_xla_bf16:
max abs and relative (to the largest |want|) error of each gradient
(`dW_max_abs_error_vs_bf16`, ...) and `grad_max_rel_error_vs_bf16`, the
largest relative one. grad_xla's shows how far float32 (TF32) products are
from bfloat16 ones; a persistent row should be far closer than that.

The barrier_* rows time the grid barrier alone (benchmarks/grid_barrier_probe.py):
one launch of the forward kernel's G blocks crossing it --crossings times a
step for the window's steps (11: a Mogrifier of 5 rounds), each crossing with
a (64, 8) float32 tile written and a neighbour's read by TMA, in mode
persistent, unfenced and no_barrier (the copies without it: the floor).
`us_per_crossing` is the median time over the crossings, `stale_blocks` the
blocks that read a neighbour's tile before it was written (0 where the
barrier holds; no_barrier's shows that the check can see one).

Rows are measured from the surest to the least sure, the persistent kernel's
rows last, and the JSON (--output) is rewritten after each: a kernel that hangs
(its blocks not all resident) leaves every figure before it. A row that
fails is left out with its reason (`failed`), and the script then exits with
an error. `--rows=barrier_persistent` runs the barrier alone, in seconds:
the GPU kit's first check that it ends, before any kernel that crosses it.
--tiny runs it at a tiny size in Pallas' GPU interpreter on any
machine, the persistent modes in one block (the interpreter has no
semaphores): a check that the script runs, not a speed.

  python benchmarks/persistent_probe.py [--output=runs/persistent_probe.json]
      [--hidden=951 --batch=64 --steps=70 --blocks=N --runs=20 --grad_runs=10]
      [--rows=ROW,... | --skip_rows=ROW,...] [--tiny]
"""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
from absl import app, flags
from baselines import row_failed
from grid_barrier_probe import barrier_rounds
from jax.experimental.pallas import mosaic_gpu as plgpu
from timing import median_call

from lm_zoo.cells import LSTMCell
from lm_zoo.cells.cudnn_lstm import cudnn_lstm_window
from lm_zoo.cells.lstm_recurrence import lstm_recurrence
from lm_zoo.cells.persistent_lstm import persistent_lstm_recurrence
from lm_zoo.kernels.persistent_lstm import layout_for, persistent_lstm_forward, smem_bytes
from lm_zoo.kernels.persistent_lstm_backward import backward_smem_bytes, chunk_for

flags.DEFINE_integer('hidden', 951, 'Hidden size n (the input size too).')
flags.DEFINE_integer('batch', 64, 'Batch size (at most 64).')
flags.DEFINE_integer('steps', 70, 'Window length T.')
flags.DEFINE_integer('blocks', None, "The kernel's blocks (default: one per 8 units).")
flags.DEFINE_integer(
  'crossings', 11, 'Barrier crossings a step in the barrier_* rows (a 5-round Mogrifier: 11).'
)
flags.DEFINE_integer('runs', 20, 'Timed runs per forward row (their median is reported).')
flags.DEFINE_integer('grad_runs', 10, 'Timed runs per grad_* row.')
flags.DEFINE_integer('warmup', 3, 'Untimed runs per row after compiling.')
flags.DEFINE_bool('tiny', False, 'Hidden 24, batch 3, 3 steps, interpreted: checks the script.')
flags.DEFINE_list('rows', [], 'Only these rows, in the order above (default: every row).')
flags.DEFINE_list(
  'skip_rows',
  [],
  'Rows left out (the GPU kit leaves out those that cross the '
  'barrier where the barrier alone, --rows=barrier_persistent, did not end).',
)
flags.DEFINE_string('output', 'runs/persistent_probe.json', 'JSON results file.')
FLAGS = flags.FLAGS


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


def _max_errors(name: str, got, want) -> dict:
  diff = float(jnp.max(jnp.abs(got - want)))
  rel = diff / max(float(jnp.max(jnp.abs(want))), 1e-30)
  return {f'{name}_max_abs_error': diff, f'{name}_max_rel_error': rel}


def _errors(got, want) -> dict:
  """Max abs and relative (to the largest |want|) error of hs and c_T."""
  (c, _), hs = got
  (want_c, _), want_hs = want
  return {**_max_errors('hs', hs, want_hs), **_max_errors('c', c, want_c)}


GRADS = ('dW', 'db', 'dU', 'dh0', 'dc0')


def _grad_errors(got, want) -> dict:
  """Each gradient's max abs and relative error, and the largest relative one."""
  out = {}
  for name, a, b in zip(GRADS, got[1], want[1]):
    out.update(_max_errors(name, a, b))
  out['grad_max_rel_error'] = max(out[f'{name}_max_rel_error'] for name in GRADS)
  return out


def _cudnn(hidden: int):
  """cuDNN's layer of our LSTMCell's parameters: (x, W, b, U, h0, c0) -> ((c, h), hs)."""
  if jax.default_backend() != 'gpu':
    return None
  cell = LSTMCell(hidden)

  def run(x, w, b, u, h0, c0):
    params = {'input': {'kernel': w, 'bias': b}, 'recurrent_kernel': u}
    return cudnn_lstm_window(cell, params, (c0, h0), x)

  return run


def _trained(window, cotangent):
  """(x, W, b, U, h0, c0) -> (L, dL/d(W, b, U, h0, c0)) of L = Σ window's hs ⊙ cotangent."""

  def loss(w, b, u, h0, c0, x):
    return jnp.sum(window(x, w, b, u, h0, c0)[1] * cotangent)

  grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))
  return lambda x, w, b, u, h0, c0: grad(w, b, u, h0, c0, x)


def _rows(sizes, interpret):
  """name -> (the function of (x, W, b, U, h0, c0), what it is checked as:
  'forward', 'grad' or None, the kernel's blocks or None), surest first."""
  project = lambda x, w, b: x @ w + b
  window = lambda recurrence, **kw: (
    lambda x, w, b, u, h0, c0: recurrence(project(x, w, b), u, (c0, h0), **kw)
  )
  reference = lambda dtype: window(lstm_recurrence, dtype=dtype)

  def kernel(mode, blocks):
    run = functools.partial(persistent_lstm_forward, mode=mode, blocks=blocks, interpret=interpret)
    return lambda x, w, b, u, h0, c0: run(project(x, w, b), u, h0, c0)

  def trained(mode, blocks):
    recurrence = functools.partial(persistent_lstm_recurrence, interpret=interpret)
    return window(recurrence, mode=mode, blocks=blocks)

  cotangent = jax.random.normal(
    jax.random.key(1), (sizes['steps'], sizes['batch'], sizes['hidden'])
  )
  grad = lambda fn: None if fn is None else _trained(fn, cotangent)
  # Interpreted, a persistent grid has one block (no semaphores there).
  one = 1 if interpret is not None else FLAGS.blocks
  grid = lambda blocks: layout_for(sizes['batch'], sizes['hidden'], blocks).blocks
  rows = {
    'input_projection': (lambda x, w, b, *_: project(x, w, b), None, None),
    'xla': (reference(jnp.float32), None, None),
    'xla_bf16': (reference(jnp.bfloat16), None, None),
    'cudnn': (_cudnn(sizes['hidden']), 'forward', None),
    'grad_xla': (grad(reference(jnp.float32)), 'grad', None),
    'grad_xla_bf16': (grad(reference(jnp.bfloat16)), None, None),
    'grad_cudnn': (grad(_cudnn(sizes['hidden'])), 'grad', None),
    'per_step': (kernel('per_step', FLAGS.blocks), 'forward', grid(FLAGS.blocks)),
    'no_barrier': (kernel('no_barrier', one), 'forward', grid(one)),
    'grad_per_step': (grad(trained('per_step', FLAGS.blocks)), 'grad', grid(FLAGS.blocks)),
    'grad_no_barrier': (grad(trained('no_barrier', one)), 'grad', grid(one)),
    'unfenced': (kernel('unfenced', one), 'forward', grid(one)),
    'persistent': (kernel('persistent', one), 'forward', grid(one)),
    'grad_persistent': (grad(trained('persistent', one)), 'grad', grid(one)),
  }
  rows = {name: (jax.jit(fn), *rest) for name, (fn, *rest) in rows.items() if fn is not None}
  rounds = sizes['steps'] * FLAGS.crossings
  for mode in ('no_barrier', 'unfenced', 'persistent'):
    # Jitted already, and not again: jax 0.11's XLA on a CPU aborts compiling
    # the interpreted kernel inside another jit (its CSE of the NaN constants
    # that fill the kernel's buffers, behind ordered callbacks).
    crossing = barrier_rounds(grid(one), rounds, mode, interpret)
    rows[f'barrier_{mode}'] = (lambda *_, run=crossing: run(), 'barrier', grid(one))
  return rows


def _chosen(rows: dict) -> dict:
  """The rows --rows and --skip_rows leave, in their order."""
  unknown = sorted(set(FLAGS.rows + FLAGS.skip_rows) - set(rows))
  if unknown:
    raise SystemExit(f'error: --rows, --skip_rows: no row {unknown}; the rows: {", ".join(rows)}')
  wanted = set(FLAGS.rows or rows) - set(FLAGS.skip_rows)
  return {name: row for name, row in rows.items() if name in wanted}


def _wants(rows: dict, checks: set, args) -> dict:
  """The references the chosen rows are checked against, and only those."""
  wants = {}
  if 'forward' in checks:
    with jax.default_matmul_precision('highest'):  # float32 products exact, not TF32
      wants['forward'] = {'f32': rows['xla'][0](*args)}
    wants['forward']['bf16'] = rows['xla_bf16'][0](*args)
  if 'grad' in checks:
    wants['grad'] = {'bf16': rows['grad_xla_bf16'][0](*args)}
  return wants


def _measure(name, fn, check, blocks, args, wants) -> dict:
  runs = FLAGS.grad_runs if name.startswith('grad_') else FLAGS.runs
  got, timing = median_call(fn, args, runs, FLAGS.warmup)
  row = {'row': name, **({'blocks': blocks} if blocks else {}), **timing}
  if check == 'barrier':
    sums = jnp.sum(got, axis=(1, 2))
    rounds = FLAGS.steps * FLAGS.crossings
    row.update(
      rounds=rounds,
      us_per_crossing=1e3 * row['median_ms'] / rounds,
      stale_blocks=int(jnp.sum(~(sums == 0))),  # NaN: a slot never written
    )
  elif check:
    errors = _errors if check == 'forward' else _grad_errors
    for ref, want in wants[check].items():
      row.update({f'{key}_vs_{ref}': value for key, value in errors(got, want).items()})
  return row


def _write(result: dict):
  path = pathlib.Path(FLAGS.output)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=2))


def _print_table(result: dict):
  """The rows; errors: the forward rows' max abs error of hs, the grad rows'
  largest relative error of a gradient (vs grad_xla_bf16); the barrier
  rows' time a crossing and stale blocks."""
  print(
    f'{"row":>18} {"median ms":>10} {"us/step":>8} {"hs err vs f32":>14} {"vs bf16":>12}', end=''
  )
  print(f' {"grad rel err vs bf16":>21}')
  for r in result['results']:
    names = [f'hs_max_abs_error_vs_{ref}' for ref in ('f32', 'bf16')]
    errors = [r.get(name) for name in (*names, 'grad_max_rel_error_vs_bf16')]
    shown = ' '.join(
      f'{e:>{w}.2e}' if e is not None else ' ' * w for e, w in zip(errors, (14, 12, 21))
    )
    per_step = 1e3 * r['median_ms'] / result['sizes']['steps']
    if 'us_per_crossing' in r:
      shown = f'{r["us_per_crossing"]:.3f} us a crossing, {r["stale_blocks"]} stale blocks'
    print(f'{r["row"]:>18} {r["median_ms"]:>10.3f} {per_step:>8.2f} {shown}')
  for name, reason in result['failed'].items():
    print(f'{name:>18} failed: {reason}')


def _result(sizes, interpret) -> dict:
  layout = layout_for(FLAGS.batch, FLAGS.hidden, FLAGS.blocks)
  device = jax.devices()[0]
  return {
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
      'smem_bytes': smem_bytes(layout, saves=True),
      'backward_chunk': chunk_for(layout),
      'backward_smem_bytes': backward_smem_bytes(layout, chunk_for(layout)),
    },
    'results': [],
    'failed': {},
  }


def main(argv):
  del argv
  if FLAGS.tiny:
    FLAGS.hidden, FLAGS.batch, FLAGS.steps = 24, 3, 3
    FLAGS.runs, FLAGS.grad_runs, FLAGS.warmup = 1, 1, 0
  if not FLAGS.tiny and jax.default_backend() != 'gpu':
    raise SystemExit('error: the probe times a GPU kernel; --tiny runs it interpreted elsewhere')
  interpret = plgpu.InterpretGPUParams() if FLAGS.tiny else None
  sizes = {'hidden': FLAGS.hidden, 'batch': FLAGS.batch, 'steps': FLAGS.steps}
  result = _result(sizes, interpret)
  args = _inputs(**sizes)
  every_row = _rows(sizes, interpret)
  rows = _chosen(every_row)
  wants = _wants(every_row, {check for _, check, _ in rows.values()}, args)
  print(f'{result["device_kind"]}, jax {jax.__version__}; {sizes}; layout {result["layout"]}')
  for name, (fn, check, blocks) in rows.items():
    print(f'{name}: compiling and timing', flush=True)  # a hang shows where
    try:
      result['results'].append(_measure(name, fn, check, blocks, args, wants))
      print(f'{name}: {result["results"][-1]["median_ms"]:.3f} ms', flush=True)
    except Exception as err:  # any failure: this row's reason, not the run's end
      row_failed(name, err, result['failed'])
    _write(result)
  _print_table(result)
  print(f'wrote {FLAGS.output}')
  if result['failed']:
    raise SystemExit(f'error: {", ".join(result["failed"])} failed (reasons above)')


if __name__ == '__main__':
  app.run(main)
