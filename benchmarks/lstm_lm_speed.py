"""Train and eval tokens/s of recurrent LMs against PyTorch and flax, in one run.

Every model is a 2-layer LM with embedding = hidden size, vocabulary 10k,
batch 20, BPTT 35, plain SGD with gradient clipping (`base_config`):

- ours: `lstm` (`LSTMCell`, input projection hoisted, hand-written backward
  pass with one recurrent weight-gradient product per window), `lstm_autodiff`
  (the same with autodiff of the hoisted scan: `model.scan='hoisted'`),
  `lstm_bf16` (bfloat16 products summed in float32, `lm_zoo.layers.products`),
  `lstm_unroll2|5` (scan unroll), `lstm_remat` (each step recomputed in the
  backward pass: `model.scan='remat'`), the
  Mogrifier LSTM (r = 5, k = 40; `mogrifier_r5_k40_autodiff` without its
  hand-written backward pass), the aLSTM (recurrent, static and LSTM-RHN
  adaptation models; `alstm_rhn_scan`: the LSTM-RHN stack under the plain
  scan instead of its fused window), AWD-LSTM's dropouts, the dual connection and a
  5-component MoS; `*_bf16`: the same in bfloat16 products;
- baselines: PyTorch's `nn.LSTM` LM (oneDNN's fused kernel; skipped with a
  message when torch is not installed: `pip install torch`), the same under
  `torch.autocast` to bfloat16 (`torch_lstm_bf16_autocast`, to compare with
  `lstm_bf16`) and flax's
  `nn.RNN(nn.OptimizedLSTMCell)` equivalent (everything inside the scan).

It also measures the machine's fp32 matmul peak (the best 2048-cube product
of every round) and prints, for the models with the plain LSTM's arithmetic,
the fraction of that peak a train step reaches, counting 3x the forward
pass's matmul FLOPs. Ratios are against the baselines measured in the same
run; the JSON holds everything.

The process's malloc keeps freed memory (`lm_zoo.runtime.retain_host_memory`,
as lm_zoo's programs do), for PyTorch as much as for JAX; `--system_malloc`
measures everything with glibc's defaults instead.

  python benchmarks/lstm_lm_speed.py [--sizes=200,650] [--steps=10] [--rounds=3] [--models=...]
"""

import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
from absl import app, flags
from baselines import lm_zoo_lm, torch_lm
from timing import best_seconds, seconds_per_call

from lm_zoo.configs import base_config
from lm_zoo.runtime import retain_host_memory

flags.DEFINE_list('sizes', ['200', '650'], 'Hidden (= embedding) sizes.')
# name -> model config fields, or a function of the hidden size giving them
MODELS = {
  'lstm': {},
  'lstm_autodiff': {'scan': 'hoisted'},
  'lstm_bf16': {'dtype': 'bfloat16'},
  'lstm_unroll2': {'unroll': 2},
  'lstm_unroll5': {'unroll': 5},
  'lstm_remat': {'scan': 'remat'},
  'mogrifier_r5_k40': {'mogrifier': {'rounds': 5, 'rank': 40}},
  'mogrifier_r5_k40_autodiff': {'mogrifier': {'rounds': 5, 'rank': 40}, 'scan': 'scan'},
  'mogrifier_r5_k40_bf16': {'mogrifier': {'rounds': 5, 'rank': 40}, 'dtype': 'bfloat16'},
  'alstm': {'cell': 'alstm'},
  'alstm_bf16': {'cell': 'alstm', 'dtype': 'bfloat16'},
  'alstm_static': {'cell': 'alstm', 'alstm': {'latent': 'static'}},
  'alstm_rhn': {'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn'}},
  'alstm_rhn_scan': {'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn'}, 'scan': 'scan'},
  'awd_lstm': {
    'dropout_embedding': 0.1,
    'weight_drop': 0.5,
    'dropout_input': 0.4,
    'dropout_hidden': 0.25,
    'dropout_output': 0.4,
  },
  'dual_lstm': lambda hidden: {'tie_embeddings': True, 'dual': {'size': hidden}},
  'dual_lstm_bf16': lambda hidden: {
    'tie_embeddings': True,
    'dual': {'size': hidden},
    'dtype': 'bfloat16',
  },
  'mos_lstm': {'tie_embeddings': True, 'head': 'mos', 'mos': {'components': 5}},
  'mos_lstm_bf16': {
    'tie_embeddings': True,
    'head': 'mos',
    'mos': {'components': 5},
    'dtype': 'bfloat16',
  },
  'flax_lstm': {'cell': 'flax_lstm'},
}
TORCH = 'torch_lstm'
TORCH_BF16 = 'torch_lstm_bf16_autocast'
TORCH_MODELS = (TORCH, TORCH_BF16)
# Models whose train step does the plain LSTM LM's float32 matmuls (fraction of peak).
LSTM_ARITHMETIC = ('lstm', 'lstm_autodiff', 'lstm_unroll2', 'lstm_unroll5', 'flax_lstm', TORCH)
flags.DEFINE_list(
  'models',
  ['lstm', 'lstm_autodiff', 'mogrifier_r5_k40', 'alstm', 'dual_lstm', 'flax_lstm', TORCH],
  f'Models from {[*MODELS, *TORCH_MODELS]}.',
)
flags.DEFINE_integer('steps', 10, 'Timed steps per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds over all models; each keeps its fastest.')
flags.DEFINE_integer('vocab', 10_000, 'Vocabulary size.')
flags.DEFINE_integer('batch_size', 20, 'Batch size.')
flags.DEFINE_integer('bptt', 35, 'Window length.')
flags.DEFINE_string('output', 'runs/bench_lstm_lm.json', 'JSON results file.')
flags.DEFINE_bool(
  'system_malloc',
  False,
  "Leave glibc's malloc settings as they are "
  '(returning freed blocks to the kernel) instead of retaining freed memory.',
)
FLAGS = flags.FLAGS


def matmul_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
  """The best fp32 GFLOP/s of a size-cube matrix product under jit."""
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  product = jax.jit(lambda x: x @ a)
  return 2 * size**3 / best_seconds(lambda: product(a), repeats) / 1e9


def train_flops_per_token(hidden: int, vocab: int, layers: int = 2) -> float:
  """3x the forward matmul FLOPs of the LSTM LM per token (the backward pass
  does two products per forward product)."""
  lstm = layers * 2 * (hidden + hidden) * 4 * hidden
  return 3 * (lstm + 2 * hidden * vocab)


def build(name: str, hidden: int) -> dict:
  """Compiled train and eval calls of one of our models (or flax's)."""
  config = base_config()
  config.model.update(hidden_size=hidden, embed_size=hidden, num_layers=2)
  fields = MODELS[name]
  config.model.update(fields(hidden) if callable(fields) else fields)
  config.data.update(batch_size=FLAGS.batch_size, bptt=FLAGS.bptt)
  return lm_zoo_lm(config, FLAGS.vocab)


def build_torch(name: str, hidden: int) -> dict | None:
  """The same LM in PyTorch (`baselines.torch_lm`)."""
  return torch_lm(name, hidden, FLAGS.vocab, FLAGS.batch_size, FLAGS.bptt)


def round_seconds(calls: dict, key: str) -> float:
  """Seconds per call of `calls[key]`, over one round of --steps calls."""
  return seconds_per_call(calls, key, FLAGS.steps)


def main(argv):
  del argv
  unknown = set(FLAGS.models) - {*MODELS, *TORCH_MODELS}
  if unknown:
    raise app.UsageError(
      f'unknown models {sorted(unknown)}: choose from {[*MODELS, *TORCH_MODELS]}'
    )
  malloc = 'system' if FLAGS.system_malloc or not retain_host_memory() else 'retained'
  peak = 0.0
  tokens = FLAGS.batch_size * FLAGS.bptt
  rows = []
  for size in map(int, FLAGS.sizes):
    built = {
      name: (build_torch(name, size) if name in TORCH_MODELS else build(name, size))
      for name in FLAGS.models
    }
    built = {name: calls for name, calls in built.items() if calls is not None}
    # Rounds interleave the models, so slow drifts of a shared machine hit all
    # of them; each model keeps its best round.
    seconds = {name: {'train': math.inf, 'eval': math.inf} for name in built}
    for _ in range(FLAGS.rounds):
      # The peak drifts with the machine's load as the models do.
      peak = max(peak, matmul_peak_gflops())
      for name, calls in built.items():
        for key in ('train', 'eval'):
          seconds[name][key] = min(seconds[name][key], round_seconds(calls, key))
    for name in built:
      row = {
        'model': name,
        'hidden': size,
        'train_seconds': seconds[name]['train'],
        'eval_seconds': seconds[name]['eval'],
        'train_tokens_per_s': tokens / seconds[name]['train'],
        'eval_tokens_per_s': tokens / seconds[name]['eval'],
      }
      if 'library' in built[name]:
        row['library'] = built[name]['library']
      rows.append(row)
  for row in rows:
    if row['model'] in LSTM_ARITHMETIC:
      row['fraction_of_matmul_peak'] = (
        row['train_tokens_per_s'] * train_flops_per_token(row['hidden'], FLAGS.vocab) / (peak * 1e9)
      )

  by_key = {(r['model'], r['hidden']): r for r in rows}
  baselines = [b for b in (*TORCH_MODELS, 'flax_lstm') if b in FLAGS.models]
  print(
    f'\ndevices: {jax.devices()}; {os.cpu_count()} CPUs; fp32 matmul peak '
    f'{peak:.0f} GFLOP/s (2048 cube); vocab {FLAGS.vocab}, batch {FLAGS.batch_size}, '
    f'BPTT {FLAGS.bptt}, 2 layers; malloc {malloc}'
  )
  header = (
    f'{"model":>25} {"hidden":>6} {"train tok/s":>11} {"eval tok/s":>10} '
    f'{"of peak":>7} {"step vs lstm":>12}'
  )
  header += ''.join(f' {"train/" + b:>16} {"eval/" + b:>15}' for b in baselines)
  print(header)
  for r in rows:
    lstm = by_key.get(('lstm', r['hidden']))
    if lstm:
      r['step_time_vs_lstm'] = r['train_seconds'] / lstm['train_seconds']
    line = (
      f'{r["model"]:>25} {r["hidden"]:>6} {r["train_tokens_per_s"]:>11,.0f} '
      f'{r["eval_tokens_per_s"]:>10,.0f} '
      f'{r.get("fraction_of_matmul_peak", float("nan")):>7.0%} '
      f'{r.get("step_time_vs_lstm", float("nan")):>12.2f}'
    )
    for b in baselines:
      base = by_key.get((b, r['hidden']))
      if base:
        r[f'train_ratio_vs_{b}'] = r['train_tokens_per_s'] / base['train_tokens_per_s']
        r[f'eval_ratio_vs_{b}'] = r['eval_tokens_per_s'] / base['eval_tokens_per_s']
      line += (
        f' {r.get(f"train_ratio_vs_{b}", float("nan")):>16.2f}'
        f' {r.get(f"eval_ratio_vs_{b}", float("nan")):>15.2f}'
      )
    print(line)
  if FLAGS.output:
    path = pathlib.Path(FLAGS.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
      json.dumps(
        {
          'matmul_peak_gflops': peak,
          'malloc': malloc,
          'baselines': baselines,
          'cpus': os.cpu_count(),
          'devices': [str(d) for d in jax.devices()],
          'vocab': FLAGS.vocab,
          'batch_size': FLAGS.batch_size,
          'bptt': FLAGS.bptt,
          'results': rows,
        },
        indent=2,
      )
    )
    print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
