"""Train and eval tokens/s of recurrent LMs (vocab 10k, batch 20, BPTT 35).

Measures our `RecurrentLM` with `lm_zoo.cells.LSTMCell` (input projection
hoisted out of the scan), the Mogrifier LSTM (r = 5, k = 40), the aLSTM (IO
adaptation; recurrent, static and LSTM-RHN adaptation models of size 100),
the LSTM with AWD-LSTM's dropouts and weight drop, the LSTM with a dual
connection and with a 5-component mixture of softmaxes and, as the
baseline in the same run, the same stack with flax's `nn.OptimizedLSTMCell`
(everything inside the scan), at hidden sizes 200 and 650. Prints a table with
ratios against the baseline and writes JSON.

  python benchmarks/lstm_lm_speed.py [--sizes=200,650] [--steps=20] [--output=bench.json]
"""

import json
import pathlib
import time

import jax
import numpy as np
from absl import app, flags

from lm_zoo.configs import base_config
from lm_zoo.models import build_model
from lm_zoo.training import create_train_state, make_eval_step, make_optimizer, make_train_step

flags.DEFINE_list('sizes', ['200', '650'], 'Hidden (= embedding) sizes.')
# name -> model config fields, or a function of the hidden size giving them
MODELS = {
    'lstm': {},
    'mogrifier_r5_k40': {'mogrifier': {'rounds': 5, 'rank': 40}},
    'alstm': {'cell': 'alstm'},
    'alstm_static': {'cell': 'alstm', 'alstm': {'latent': 'static'}},
    'alstm_rhn': {'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn'}},
    'awd_lstm': {'dropout_embedding': 0.1, 'weight_drop': 0.5, 'dropout_input': 0.4,
                 'dropout_hidden': 0.25, 'dropout_output': 0.4},
    'dual_lstm': lambda hidden: {'tie_embeddings': True, 'dual': {'size': hidden}},
    'mos_lstm': {'tie_embeddings': True, 'mos': {'components': 5}},
    'flax_lstm': {'cell': 'flax_lstm'},
}
flags.DEFINE_list('models', list(MODELS), f'Models from {list(MODELS)}; the last '
                  'one is the baseline.')
flags.DEFINE_integer('steps', 20, 'Timed steps after warm-up.')
flags.DEFINE_integer('vocab', 10_000, 'Vocabulary size.')
flags.DEFINE_integer('batch_size', 20, 'Batch size.')
flags.DEFINE_integer('bptt', 35, 'Window length.')
flags.DEFINE_string('output', 'runs/bench_lstm_lm.json', 'JSON results file.')
FLAGS = flags.FLAGS


def _timed(fn, steps):
  jax.block_until_ready(fn())  # compile
  jax.block_until_ready(fn())
  start = time.perf_counter()
  for _ in range(steps):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / steps


def measure(name: str, hidden: int) -> dict:
  config = base_config()
  config.model.update(hidden_size=hidden, embed_size=hidden, num_layers=2)
  fields = MODELS[name]
  config.model.update(fields(hidden) if callable(fields) else fields)
  config.data.update(batch_size=FLAGS.batch_size, bptt=FLAGS.bptt)
  model = build_model(config.model, FLAGS.vocab)
  optimizer = make_optimizer(config.optimizer)
  train_step = make_train_step(model, optimizer)
  eval_step = make_eval_step(model)
  rng = np.random.default_rng(0)
  shape = (FLAGS.batch_size, FLAGS.bptt)
  inputs = rng.integers(0, FLAGS.vocab, shape).astype(np.int32)
  targets = rng.integers(0, FLAGS.vocab, shape).astype(np.int32)
  weights = np.ones(shape, np.float32)
  holder = {'state': create_train_state(model, optimizer, config)}

  def train():
    holder['state'], metrics = train_step(holder['state'], inputs, targets, weights)
    return metrics['loss']

  train_seconds = _timed(train, FLAGS.steps)
  params, carries = holder['state'].params, holder['state'].carries
  eval_seconds = _timed(lambda: eval_step(params, carries, inputs, targets, weights)[0],
                        FLAGS.steps)
  tokens = FLAGS.batch_size * FLAGS.bptt
  return {'model': name, 'hidden': hidden, 'train_tokens_per_s': tokens / train_seconds,
          'eval_tokens_per_s': tokens / eval_seconds}


def main(argv):
  del argv
  rows = [measure(name, int(size)) for size in FLAGS.sizes for name in FLAGS.models]
  baseline = {r['hidden']: r for r in rows if r['model'] == FLAGS.models[-1]}
  print(f'devices: {jax.devices()}; vocab {FLAGS.vocab}, batch {FLAGS.batch_size}, '
        f'BPTT {FLAGS.bptt}, 2 layers')
  print(f'{"model":>16} {"hidden":>6} {"train tok/s":>12} {"eval tok/s":>11} '
        f'{"train ratio":>11} {"eval ratio":>10}')
  for r in rows:
    base = baseline[r['hidden']]
    r['train_ratio_vs_baseline'] = r['train_tokens_per_s'] / base['train_tokens_per_s']
    r['eval_ratio_vs_baseline'] = r['eval_tokens_per_s'] / base['eval_tokens_per_s']
    print(f'{r["model"]:>16} {r["hidden"]:>6} {r["train_tokens_per_s"]:>12,.0f} '
          f'{r["eval_tokens_per_s"]:>11,.0f} {r["train_ratio_vs_baseline"]:>11.2f} '
          f'{r["eval_ratio_vs_baseline"]:>10.2f}')
  if FLAGS.output:
    path = pathlib.Path(FLAGS.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({'baseline': FLAGS.models[-1], 'results': rows}, indent=2))
    print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
