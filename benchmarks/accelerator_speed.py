"""Train and eval tokens/s of the papers' recipes on this machine's
accelerator, beside cuDNN's LSTM (from JAX and from PyTorch) and flax's.

Each recipe (`--recipes`, NAME:VARIANT of lm_zoo/experiments) is timed as its
config trains: its model at its size (the 24M PTB Mogrifier: r 5, k 84,
hidden 912), its batch and BPTT (64 x 70), dropouts, losses and optimizer,
on random token ids. The baselines are the plain 2-layer LSTM LM at the first
recipe's hidden size, batch and BPTT, float32: `jax_cudnn_lstm`
(`jax.experimental.rnn`, GPU only: skipped with a message elsewhere),
`torch_lstm` (cuDNN on a GPU, oneDNN on a CPU), `torch_lstm_bf16` (autocast)
and `flax_lstm` (`nn.RNN(nn.OptimizedLSTMCell)`); every row's ratio to each.

Also written, per recipe: the hours its whole training implies at the
measured rate (its planned updates x batch x BPTT tokens; for epoch-based
recipes the corpus must be in $LM_ZOO_DATA); per row, where a step's time
goes: its model FLOPs (6 x the parameters a token is multiplied by x its
tokens) and the rate they run at, beside the time of the window's recurrent
products alone (`recurrence_matmul_seconds`):
a step many times that is bound by per-step launches and gate arithmetic,
not matrix work. `--profile_dir` keeps a `jax.profiler` trace of `--steps`
more train steps of every row, after the timed rounds and not timed
(TensorBoard's profile plugin reads it; a Perfetto JSON trace beside it), and
on a GPU counts from it the kernels (and the few copies and memsets) each
train step runs and the fraction of the traced wall time the device spends in
them (`profile_kernels_per_step`, `profile_device_busy`): many small kernels
with the device idle between them mean launch-bound; many small kernels
keeping it busy, a chain of dependent steps too small to fill the device.

  python benchmarks/accelerator_speed.py [--recipes=...] [--steps=20] [--rounds=3]
"""

import json
import os
import pathlib

import jax
from absl import app, flags

from baselines import (device_kernels, experiment_config, jax_rnn_lm, lm_zoo_lm, recurrence_matmul_seconds,
                       seconds_per_call, torch_lm)
from lm_zoo.data import load_corpus
from lm_zoo.models import build_model, layer_sizes
from lm_zoo.runtime import retain_host_memory

flags.DEFINE_list('recipes', ['mogrifier_paper:ptb_lstm', 'mogrifier_paper:ptb_mogrifier',
                              'alstm_paper:ptb'],
                  'NAME:VARIANT of lm_zoo/experiments to time as they train.')
BASELINES = ('jax_cudnn_lstm', 'torch_lstm', 'torch_lstm_bf16', 'flax_lstm')
flags.DEFINE_list('baselines', list(BASELINES), f'From {list(BASELINES)}.')
flags.DEFINE_integer('steps', 20, 'Timed steps per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds over all rows; each keeps its fastest.')
flags.DEFINE_string('output', 'runs/bench_accelerator.json', 'JSON results file.')
flags.DEFINE_string('profile_dir', '', 'Where to keep a jax.profiler trace of --steps more '
                    'train steps of every row, untimed (empty: none).')
flags.DEFINE_integer('tiny', 0, '> 0: every model at this hidden size, batch 4, BPTT 5 '
                     'and vocabulary 50 (a smoke test of the whole script, as CI runs it).')
flags.DEFINE_bool('cudnn_reference', False, "Without a GPU, run jax_cudnn_lstm's row with "
                  "jax.experimental.rnn's reference scan instead of skipping it (tests "
                  'the code; not a speed figure).')
FLAGS = flags.FLAGS
VOCAB = 10_000  # PTB's; the papers' PTB recipes


def recipe_config(recipe: str):
  """The config of `NAME:VARIANT`, shrunk under --tiny."""
  return experiment_config(recipe, FLAGS.tiny)


def vocab_size() -> int:
  return 50 if FLAGS.tiny else VOCAB


def recipe_tokens(config) -> int | None:
  """Tokens the recipe trains on: its updates x batch x BPTT (max_steps),
  else its epochs over the corpus's training split (None without the data)."""
  data = config.data
  if config.train.max_steps > 0:
    return config.train.max_steps * data.batch_size * data.bptt
  try:
    corpus = load_corpus(data.name, data.data_dir or None)
  except Exception as err:  # the corpus is not here: no hours for this recipe
    print(f'{data.name}: no hours implied ({err})')
    return None
  return config.train.num_epochs * len(corpus.train)


def build_baseline(name: str, hidden: int, batch: int, bptt: int) -> dict | None:
  if name == 'jax_cudnn_lstm':
    return jax_rnn_lm(hidden, vocab_size(), batch, bptt,
                      reference=FLAGS.cudnn_reference and jax.default_backend() != 'gpu')
  if name in ('torch_lstm', 'torch_lstm_bf16'):
    return torch_lm(hidden, vocab_size(), batch, bptt, bfloat16=name == 'torch_lstm_bf16')
  config = recipe_config(FLAGS.recipes[0])  # flax_lstm: our loop's LM with flax's cell
  config.model.update(cell='flax_lstm', num_layers=2, param_budget=0, hidden_size=hidden,
                      embed_size=hidden, embed_ratio=-1.0, output_size=0, dtype='float32',
                      tie_embeddings=False, skip_connections=False, cap_input_gate=False)
  config.model.mogrifier.rounds = 0
  return lm_zoo_lm(config, vocab_size())


def main(argv):
  del argv
  unknown = set(FLAGS.baselines) - set(BASELINES)
  if unknown:
    raise app.UsageError(f'unknown baselines {sorted(unknown)}: choose from {list(BASELINES)}')
  malloc = 'retained' if retain_host_memory() else 'system'  # off on GPU and TPU
  configs = {recipe: recipe_config(recipe) for recipe in FLAGS.recipes}
  first = configs[FLAGS.recipes[0]]
  built = {recipe: lm_zoo_lm(config, vocab_size()) for recipe, config in configs.items()}
  hidden = layer_sizes(build_model(first.model, vocab_size()))[0]
  batch, bptt = first.data.batch_size, first.data.bptt
  for name in FLAGS.baselines:
    calls = build_baseline(name, hidden, batch, bptt)
    if calls is not None:
      built[name] = calls
  seconds = {name: {'train': float('inf'), 'eval': float('inf')} for name in built}
  for _ in range(FLAGS.rounds):
    for name, calls in built.items():
      for key in ('train', 'eval'):
        seconds[name][key] = min(seconds[name][key],
                                 seconds_per_call(calls, key, FLAGS.steps))
  kernels = {}  # traced after the timing: profiling slows a step by up to 40% on a GPU
  for name, calls in built.items() if FLAGS.profile_dir else ():
    trace_dir = os.path.join(FLAGS.profile_dir, name.replace(':', '_'))
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    seconds_per_call(calls, 'train', FLAGS.steps)
    jax.profiler.stop_trace()
    kernels[name] = device_kernels(trace_dir)

  rows = []
  for name, calls in built.items():
    config = configs.get(name, first)
    tokens = config.data.batch_size * config.data.bptt
    row = {'row': name, 'train_seconds': seconds[name]['train'],
           'eval_seconds': seconds[name]['eval'],
           'train_tokens_per_s': tokens / seconds[name]['train'],
           'eval_tokens_per_s': tokens / seconds[name]['eval'],
           'batch_size': config.data.batch_size, 'bptt': config.data.bptt,
           **{k: calls[k] for k in ('model', 'library') if k in calls}}
    row['matmul_params'] = calls['matmul_params']
    row['train_step_flops'] = 6 * calls['matmul_params'] * tokens
    row['train_tflops_per_s'] = row['train_step_flops'] / seconds[name]['train'] / 1e12
    if kernels.get(name):
      row['profile_kernels_per_step'] = kernels[name]['kernels'] / FLAGS.steps
      row['profile_device_busy'] = kernels[name]['busy_seconds'] / kernels[name]['span_seconds']
    if name in configs:
      total = recipe_tokens(config)
      if total is not None:
        row['recipe_tokens'] = total
        row['recipe_hours'] = total / row['train_tokens_per_s'] / 3600
    rows.append(row)
  by_name = {r['row']: r for r in rows}
  baselines = [b for b in FLAGS.baselines if b in by_name]
  for row in rows:
    for b in baselines:
      row[f'train_ratio_vs_{b}'] = row['train_tokens_per_s'] / by_name[b]['train_tokens_per_s']
      row[f'eval_ratio_vs_{b}'] = row['eval_tokens_per_s'] / by_name[b]['eval_tokens_per_s']
  recurrence = recurrence_matmul_seconds(hidden, batch, bptt)

  device = jax.devices()[0]
  print(f'\n{device.platform}: {device.device_kind} x {jax.device_count()}; '
        f'{os.cpu_count()} CPUs; malloc {malloc}; vocabulary {vocab_size()}')
  print(f'recurrent products of one {batch} x {bptt} window at hidden {hidden} (2 layers, '
        f'forward only): {recurrence * 1e3:.2f} ms')
  header = f'{"row":>30} {"train tok/s":>11} {"eval tok/s":>10} {"TFLOP/s":>7} {"hours":>7}'
  header += ''.join(f' {"train/" + b:>22}' for b in baselines)
  print(header)
  for r in rows:
    line = (f'{r["row"]:>30} {r["train_tokens_per_s"]:>11,.0f} {r["eval_tokens_per_s"]:>10,.0f} '
            f'{r.get("train_tflops_per_s", float("nan")):>7.2f} '
            f'{r.get("recipe_hours", float("nan")):>7.1f}')
    line += ''.join(f' {r[f"train_ratio_vs_{b}"]:>22.2f}' for b in baselines)
    print(line)
  if FLAGS.profile_dir:
    print('profile of the train steps (GPU kernels from the trace):' if any(kernels.values())
          else 'profile: no device kernels in the traces (not a GPU run)')
    for r in rows:
      if 'profile_kernels_per_step' in r:
        print(f'{r["row"]:>30} {r["profile_kernels_per_step"]:>8,.0f} kernels a step, '
              f'device busy {r["profile_device_busy"]:.0%} of the span')
  if FLAGS.output:
    path = pathlib.Path(FLAGS.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        'device': str(device), 'device_kind': device.device_kind,
        'platform': device.platform, 'devices': jax.device_count(), 'cpus': os.cpu_count(),
        'malloc': malloc, 'vocab': vocab_size(), 'baseline_hidden': hidden,
        'recurrence_matmul_seconds': recurrence, 'baselines': baselines,
        'jax': jax.__version__, 'results': rows}, indent=2))
    print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
