"""Train tokens/s per seed of a recipe trained alone and in stacks of N seeds
(`lm-zoo-train --seeds=N`, lm_zoo.training.seed_axis), on this machine's
default device.

Each row times the recipe's train step vmapped over N stacked train states
(`make_train_step(stacked=True)`, built by `baselines.lm_zoo_lm`) on a
random batch of the recipe's size,
beside the `alone` row: the step a run alone takes (`lm-zoo-train` without
--seeds). `per_seed_speedup` is N x the run alone's seconds per update over
the stack's: how many times faster each seed trains in the stack than the N
seeds would one after another. The rows are timed in turns (`--rounds`),
each keeping its best.

  python benchmarks/stacked_seeds.py [--recipe=ptb_lstm_medium] [--seeds=1,2,4,8]
"""

import json
import pathlib

from absl import app, flags
from baselines import experiment_config, lm_zoo_lm
from timing import seconds_per_call

from lm_zoo.runtime import environment

flags.DEFINE_string('recipe', 'ptb_lstm_medium', 'NAME[:VARIANT] of lm_zoo/experiments.')
flags.DEFINE_list('seeds', ['1', '2', '4', '8'], 'Stack sizes to time, beside a run alone.')
flags.DEFINE_integer('steps', 20, 'Timed updates per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds over all rows; each keeps its fastest.')
flags.DEFINE_string('output', 'runs/bench_stacked_seeds.json', 'JSON results file.')
flags.DEFINE_integer(
  'tiny',
  0,
  '> 0: the model at this hidden size, batch 4, BPTT 5 and '
  'vocabulary 50 (a smoke test of the script, as CI runs it).',
)
FLAGS = flags.FLAGS


def main(argv):
  del argv
  sizes = sorted({int(n) for n in FLAGS.seeds})
  if sizes[0] < 1:
    raise app.UsageError(f'--seeds={",".join(FLAGS.seeds)}: give stack sizes of at least 1')
  config = experiment_config(FLAGS.recipe, FLAGS.tiny)
  vocab = 50 if FLAGS.tiny else 10_000
  built = {n: lm_zoo_lm(config, vocab, n) for n in [0, *sizes]}  # 0: a run alone
  seconds = {n: float('inf') for n in built}
  for _ in range(FLAGS.rounds):
    for n, calls in built.items():
      seconds[n] = min(seconds[n], seconds_per_call(calls, 'train', FLAGS.steps))
  tokens = config.data.batch_size * config.data.bptt
  rows = [
    {
      'seeds': n or 'alone',
      'seconds_per_update': seconds[n],
      'tokens_per_second': max(n, 1) * tokens / seconds[n],
      'tokens_per_second_per_seed': tokens / seconds[n],
      'per_seed_speedup': max(n, 1) * seconds[0] / seconds[n],
    }
    for n in built
  ]
  for row in rows:
    print(
      f'{row["seeds"]:>5}: {1e3 * row["seconds_per_update"]:9.2f} ms an update, '
      f'{row["tokens_per_second_per_seed"]:12,.0f} tokens/s a seed, '
      f'{row["per_seed_speedup"]:5.2f}x a run alone'
    )
  result = {
    'recipe': FLAGS.recipe,
    'model': built[0]['model'],
    'batch': config.data.batch_size,
    'bptt': config.data.bptt,
    'dtype': config.model.dtype,
    'steps': FLAGS.steps,
    'rounds': FLAGS.rounds,
    'environment': environment(),
    'results': rows,
  }
  output = pathlib.Path(FLAGS.output)
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(result, indent=2))
  print(f'written to {output}')


if __name__ == '__main__':
  app.run(main)
