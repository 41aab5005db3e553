"""The persistent Mogrifier kernels (lm_zoo.kernels.persistent_mogrifier and
persistent_mogrifier_backward) on a GPU: are they right at the 24M recipe's
size, and how fast is one layer's window beside the fused window's?

One Mogrifier LSTM layer (hidden and input 912, 5 rounds of rank 84, the
capped gate, a state dropout mask, batch 64, 70 steps: one layer of
`mogrifier_paper:ptb_mogrifier`), bfloat16 products, through
`mixed_lstm_recurrence`: 'fused' its `lax.scan` passes, 'persistent' both
passes as the kernels (`lm_zoo.cells.persistent_mogrifier.PersistentMogrifierKernels`).
Rows, each the median of --runs calls after --warmup, the JSON (--output)
rewritten after each so that a hang leaves the rows before it:

- forward_fused / forward_persistent: the outputs h_1..h_T and the carry;
- grad_fused / grad_persistent: L = Σ_t h_t ⊙ R (R fixed, random) and its
  gradients (inputs, W, b, U, every round's weights, the carry, the mask);
- forward_per_step / grad_per_step (on a GPU): the same kernels, their
  layouts compiled as the persistent rows', launched a phase at a time (the
  launch is the barrier): where these are right and the persistent rows
  wrong, the barrier is at fault, not the operands' layouts;
- forward_persistent_blocksG / grad_persistent_blocksG: the kernels on G
  blocks for each G in --blocks (the rows above: one block per 8 units, 116
  at the recipe). More blocks pad n further but can widen the streamed
  chunks (120 blocks: n_pad 960, chunks of 96 columns, not 32), one timing
  that decides the grid.

Each persistent row is checked against its fused row: the largest error of
any output or gradient relative to that array's largest magnitude
(`max_rel_error_vs_fused`; about 1e-5 or less means right: both multiply in
bfloat16 at the same places, only the order of float32 sums differs).
--tiny runs it at a tiny size in Pallas' GPU interpreter, a launch a phase:
a check that the script runs, not a speed.

  python benchmarks/persistent_mogrifier_probe.py [--output=runs/persistent_mogrifier_probe.json]
      [--hidden=912 --rank=84 --rounds=5 --batch=64 --steps=70 --runs=10] [--blocks=120] [--tiny]
"""

import json
import pathlib

import jax
import jax.numpy as jnp
from absl import app, flags
from baselines import row_failed
from jax.experimental.pallas import mosaic_gpu as plgpu
from timing import median_call

from lm_zoo.cells.mixed_lstm_recurrence import mixed_lstm_recurrence
from lm_zoo.cells.mogrifier import MogrifierRounds, round_name
from lm_zoo.cells.persistent_mogrifier import PersistentMogrifierKernels

flags.DEFINE_integer('hidden', 912, 'Hidden size n (the input size too).')
flags.DEFINE_integer('rank', 84, "The rounds' rank k.")
flags.DEFINE_integer('rounds', 5, 'Mogrifier rounds r.')
flags.DEFINE_integer('batch', 64, 'Batch size (at most 64).')
flags.DEFINE_integer('steps', 70, 'Window length T.')
flags.DEFINE_integer('runs', 10, 'Timed runs per row (their median is reported).')
flags.DEFINE_integer('warmup', 2, 'Untimed runs per row after compiling.')
flags.DEFINE_list('blocks', [], 'Other grids to time the kernels on: blocks each (at most 132).')
flags.DEFINE_bool('tiny', False, 'Hidden 16, rank 8, 2 rounds, batch 3, 1 step, interpreted.')
flags.DEFINE_string('output', 'runs/persistent_mogrifier_probe.json', 'JSON results file.')
FLAGS = flags.FLAGS


def _arguments(n: int, k: int, r: int, batch: int, steps: int):
  """x, W, b, U, c_0, h_0, the mask, the rounds' parameters (scaled as at init)."""
  keys = iter(jax.random.split(jax.random.key(0), 8 + 3 * r))
  normal = lambda shape, scale: scale * jax.random.normal(next(keys), shape)
  rounds = {
    round_name(i): {
      'kernel_in': normal((n, k), n**-0.5),
      'kernel_out': normal((k, n), k**-0.5),
      'bias': normal((n,), 0.1),
    }
    for i in range(1, r + 1)
  }
  mask = (jax.random.uniform(next(keys), (batch, n)) > 0.4) / 0.6
  return (
    normal((steps, batch, n), 1.0),
    normal((n, 4 * n), n**-0.5),
    normal((4 * n,), 0.1),
    normal((n, 4 * n), n**-0.5),
    normal((batch, n), 1.0),
    jnp.tanh(normal((batch, n), 1.0)),
    mask,
    rounds,
  )


def _functions(kernels, r: int, cotangent):
  """(forward, grad) of the layer's window, its passes `kernels`' or the scan's."""
  passes = {} if kernels is None else dict(forward=kernels.forward, backward=kernels.backward)
  mix = MogrifierRounds(r, True, jnp.bfloat16)

  def forward(x, w, b, u, c0, h0, mask, rounds):
    args = (x, w, b, u, (c0, h0), mix, rounds, mask, jnp.bfloat16, 1, True)
    return mixed_lstm_recurrence(*args, **passes)

  def loss(*args):
    _, hs = forward(*args)
    return jnp.sum(hs * cotangent)

  return jax.jit(forward), jax.jit(jax.value_and_grad(loss, argnums=tuple(range(8))))


def _max_rel_error(got, want) -> float:
  """The largest |got - want| of any array over that array's largest |want|."""
  errors = [
    float(jnp.max(jnp.abs(g - w))) / max(float(jnp.max(jnp.abs(w))), 1e-30)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
  ]
  return max(errors)


def main(argv):
  del argv
  if FLAGS.tiny:
    FLAGS.hidden, FLAGS.rank, FLAGS.rounds, FLAGS.batch, FLAGS.steps = 16, 8, 2, 3, 1
    FLAGS.runs, FLAGS.warmup = 1, 0
  if not FLAGS.tiny and jax.default_backend() != 'gpu':
    raise SystemExit('error: the probe times GPU kernels; --tiny runs them interpreted elsewhere')
  if FLAGS.tiny:
    mode, interpret = 'per_step', plgpu.InterpretGPUParams()
  else:
    mode, interpret = 'persistent', None
  try:
    grids = [None] + [int(blocks) for blocks in FLAGS.blocks]
  except ValueError:
    raise SystemExit(f'error: --blocks takes whole numbers, got {",".join(FLAGS.blocks)}') from None
  sizes = dict(n=FLAGS.hidden, k=FLAGS.rank, r=FLAGS.rounds, batch=FLAGS.batch, steps=FLAGS.steps)
  args = _arguments(**sizes)
  cotangent = jax.random.normal(jax.random.key(1), (FLAGS.steps, FLAGS.batch, FLAGS.hidden))
  device = jax.devices()[0]
  result = {'device_kind': device.device_kind, 'jax': jax.__version__, 'sizes': sizes}
  result.update(interpreted=FLAGS.tiny, results=[], failed={})
  ways = [('fused', _functions(None, FLAGS.rounds, cotangent))]
  if not FLAGS.tiny:  # interpreted, every way runs a launch a phase
    per_step = PersistentMogrifierKernels('per_step', None, None)
    ways.append(('per_step', _functions(per_step, FLAGS.rounds, cotangent)))
  for blocks in grids:
    kernels = PersistentMogrifierKernels(mode, interpret, blocks)
    way = 'persistent' if blocks is None else f'persistent_blocks{blocks}'
    ways.append((way, _functions(kernels, FLAGS.rounds, cotangent)))
  wants = {}
  rows = [(f'{p}_{way}', fns[i]) for i, p in enumerate(('forward', 'grad')) for way, fns in ways]
  for name, fn in rows:
    print(f'{name}: compiling and timing', flush=True)  # a hang shows where
    try:
      out, row = median_call(fn, args, FLAGS.runs, FLAGS.warmup)
      kind = name.split('_')[0]
      if name.endswith('fused'):
        wants[kind] = out
      elif kind in wants:
        row['max_rel_error_vs_fused'] = _max_rel_error(out, wants[kind])
      result['results'].append({'row': name, **row})
      print(f'{name}: {row}', flush=True)
    except Exception as err:  # any failure: this row's reason, not the run's end
      row_failed(name, err, result['failed'])
    path = pathlib.Path(FLAGS.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
  print(f'wrote {FLAGS.output}')
  if result['failed']:
    raise SystemExit(f'error: {", ".join(result["failed"])} failed (reasons above)')


if __name__ == '__main__':
  app.run(main)
