"""Dynamic evaluation's tokens/s beside static evaluation's, in one run.

A 2-layer LSTM LM (vocab 10k) scores a random stream at batch 1, as the
papers evaluate: statically (`evaluate_stream`, windows of `--bptt`) and
dynamically (`dynamic_evaluate` with the SGD and RMS rules and the learned
rule of `GateNetwork` (8 hidden units), segments of `--segment` tokens, each
scored and then trained on). Prints tokens/s and the ratio to static
evaluation; writes JSON.

  python benchmarks/dynamic_evaluation_speed.py [--sizes=200,650] [--tokens=2000]
"""

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from lm_zoo.cells import LSTMCell
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.runtime import retain_host_memory
from lm_zoo.optim import (NUM_FEATURES, GateNetwork, dynamic_rms, dynamic_sgd,
                          learned_update_rule)
from lm_zoo.evaluation import dynamic_evaluate, evaluate_stream, make_eval_step

flags.DEFINE_list('sizes', ['200', '650'], 'Hidden (= embedding) sizes.')
flags.DEFINE_integer('vocab', 10_000, 'Vocabulary size.')
flags.DEFINE_integer('tokens', 2000, 'Length of the scored stream.')
flags.DEFINE_integer('segment', 5, 'Dynamic evaluation segment length.')
flags.DEFINE_integer('bptt', 35, 'Static evaluation window length.')
flags.DEFINE_string('output', 'runs/bench_dynamic_evaluation.json', 'JSON results file.')
FLAGS = flags.FLAGS


def _tokens_per_second(fn) -> float:
  fn()  # compile
  start = time.perf_counter()
  fn()
  return FLAGS.tokens / (time.perf_counter() - start)


def measure(hidden: int) -> list[dict]:
  model = RecurrentLM(Embedding(FLAGS.vocab, hidden), Stack([LSTMCell(hidden), LSTMCell(hidden)]),
                      Softmax(FLAGS.vocab))
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
      'static': lambda: evaluate_stream(step, params, model.initialize_carry(1), stream, 1,
                                        FLAGS.bptt),
      'dynamic_sgd': lambda: dynamic_evaluate(model, params, sgd, stream, FLAGS.segment),
      'dynamic_rms': lambda: dynamic_evaluate(model, params, rms_rule, stream,
                                              FLAGS.segment),
      'learned_rule': lambda: dynamic_evaluate(model, params, learned, stream,
                                               FLAGS.segment, extra_args=meta),
  }
  rows = [{'mode': mode, 'hidden': hidden, 'tokens_per_s': _tokens_per_second(fn)}
          for mode, fn in runs.items()]
  for row in rows:
    row['ratio_vs_static'] = row['tokens_per_s'] / rows[0]['tokens_per_s']
  return rows


def main(argv):
  del argv
  retain_host_memory()  # as lm_zoo's programs do
  rows = [row for size in FLAGS.sizes for row in measure(int(size))]
  print(f'devices: {jax.devices()}; vocab {FLAGS.vocab}, batch 1, {FLAGS.tokens} tokens, '
        f'segment {FLAGS.segment}, static window {FLAGS.bptt}')
  print(f'{"mode":>12} {"hidden":>6} {"tokens/s":>10} {"vs static":>9}')
  for r in rows:
    print(f'{r["mode"]:>12} {r["hidden"]:>6} {r["tokens_per_s"]:>10,.0f} '
          f'{r["ratio_vs_static"]:>9.2f}')
  if FLAGS.output:
    path = pathlib.Path(FLAGS.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({'results': rows}, indent=2))
    print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
