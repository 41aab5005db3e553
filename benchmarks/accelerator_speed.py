"""Train and eval tokens/s of the papers' recipes on this machine's
accelerator, each way its layers can run a window, beside cuDNN's LSTM (from
JAX and from PyTorch, in every precision PyTorch offers) and flax's.

Each recipe (`--recipes`, NAME:VARIANT of lm_zoo/experiments) is timed as its
config trains: its model at its size (the 24M PTB Mogrifier: r 5, k 84,
hidden 912), its batch and BPTT (64 x 70), dropouts, losses and optimizer,
on random token ids; once for each of `--scans` its layers can take
(`lm_zoo.cells.scans`; the row is NAME:VARIANT@SCAN, plain for 'auto'), the
others skipped with the reason.

The baselines are the plain 2-layer LSTM LM at batch and BPTT of the first
recipe, at each of `--baseline_hidden` (the first recipe's hidden size, and
1024: the nearest size where cuDNN's persistent algorithm applies, a multiple
of 128 up to 1024 with the batch a multiple of 8): `jax_cudnn_lstm`
(`jax.experimental.rnn`, float32, GPU only: skipped with a message elsewhere),
`torch_lstm` (float32), `torch_lstm_bf16_autocast`, `torch_lstm_fp16` and
`torch_lstm_bf16` (the whole module in that dtype), and `flax_lstm`
(`nn.RNN(nn.OptimizedLSTMCell)` in our loop); rows NAME@HIDDEN.

Every row reports train and eval tokens/s, ms a train step, and its ratios
to `jax_cudnn_lstm` (`train_vs_cudnn`, `eval_vs_cudnn`) and to the fastest
PyTorch row (`train_vs_torch_fastest`, `eval_vs_torch_fastest`) of the same
hidden size in the same run, and to the fastest PyTorch row of its products'
dtype (`dtype`; `train_vs_torch_same_dtype`: autocast's products are
bfloat16); a recipe is compared at the first baseline size. `--bfloat16`
adds each recipe row once more with bfloat16 products, as NAME+bfloat16
(and a way that takes bfloat16 products only, as 'persistent' does, runs
as that row alone); `--bfloat16_only` times the NAME+bfloat16 rows alone.
Also written, per recipe: the hours its whole training implies at the
measured rate (its planned updates x batch x BPTT tokens; for epoch-based
recipes the corpus must be in $LM_ZOO_DATA); per row, its model FLOPs (6 x
the parameters a token is multiplied by x its tokens) and their rate, beside
the time of the window's recurrent products alone
(`recurrence_matmul_seconds`); per lm_zoo row, the seconds of its train and
eval steps' first calls, their compilation included
(`train_first_call_seconds`, `eval_first_call_seconds`). `--profile_dir`
counts, after the timed rounds and untimed, the kernels a train step runs
(`profile_kernels_per_step`): from a `jax.profiler` trace of `--steps` more
steps for the JAX rows (with the fraction of the traced wall time the device
spends in them, `profile_device_busy`, and the 15 kernels that took longest in all, by name,
with their count and microseconds a step, `profile_top_kernels`;
TensorBoard's profile plugin reads the trace), and
from PyTorch's profiler for its rows; on a GPU only. `--hlo_dir` keeps each
recipe row's train step as XLA optimized it for the device (text), and gives
each such row the pads that run inside its loops (`hlo_loop_pads`: each a
copy at every step). `--unpadded` adds each recipe row under 'auto' or
'fused' once more with its windows' weights left unpadded
(`aligned_contractions(1)`), as NAME+unpadded: what padding them before the
loop saves; `--held`, with its train step holding the state past a window's
own steps (`make_train_step(hold_padding=True)`, as padded variable windows
train), as NAME+held: what that selection costs. A row that fails to
compile or run is left out with its reason (`failed` in the output), the
others are timed and written, and the script then exits with an error.

  python benchmarks/accelerator_speed.py [--recipes=...] [--scans=auto,pallas]
"""

import os

import jax
from absl import app, flags
from baselines import (
  TORCH_DTYPES,
  add_ratios,
  experiment_config,
  jax_rnn_lm,
  lm_zoo_lm,
  recurrence_matmul_seconds,
  row_failed,
  torch_lm,
)
from device_traces import device_kernels, top_kernels
from optimized_hlo import write_hlo
from speed_report import report, result_row
from timing import seconds_per_call

from lm_zoo.errors import ConfigError
from lm_zoo.layers.products import aligned_contractions
from lm_zoo.models import build_model, layer_sizes
from lm_zoo.runtime import retain_host_memory

flags.DEFINE_list(
  'recipes',
  ['mogrifier_paper:ptb_lstm', 'mogrifier_paper:ptb_mogrifier', 'alstm_paper:ptb'],
  'NAME:VARIANT of lm_zoo/experiments to time as they train.',
)
flags.DEFINE_list(
  'scans',
  ['auto'],
  "Ways to run the recipes' layers (lm_zoo.cells.SCANS); one row per recipe and way it can take.",
)
BASELINES = ('jax_cudnn_lstm', *TORCH_DTYPES, 'flax_lstm')
flags.DEFINE_list('baselines', list(BASELINES), f'From {list(BASELINES)}.')
flags.DEFINE_list(
  'baseline_hidden',
  ['recipe', '1024'],
  "The baselines' hidden sizes: 'recipe' (the first recipe's) or a number.",
)
flags.DEFINE_integer('steps', 20, 'Timed steps per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds over all rows; each keeps its fastest.')
flags.DEFINE_string('output', 'runs/bench_accelerator.json', 'JSON results file.')
flags.DEFINE_string(
  'profile_dir',
  '',
  'Where to keep a jax.profiler trace of --steps more '
  'train steps of every JAX row, untimed (empty: none, and no kernel counts).',
)
flags.DEFINE_string(
  'hlo_dir',
  '',
  "Where to write each recipe row's train step as XLA "
  'compiled it for this device (optimized HLO text, ROW.hlo.txt): what its '
  'kernels are (empty: none).',
)
flags.DEFINE_bool(
  'bfloat16',
  False,
  'Also time each recipe row with bfloat16 products '
  '(model.dtype; NAME+bfloat16), beside the PyTorch rows of that dtype.',
)
flags.DEFINE_bool(
  'bfloat16_only',
  False,
  'Time each recipe row with bfloat16 products only (NAME+bfloat16), not '
  'also with its own dtype: implies --bfloat16.',
)
flags.DEFINE_bool(
  'unpadded',
  False,
  "Also time each 'auto' and 'fused' recipe row with its "
  "windows' weights unpadded (NAME+unpadded; "
  '`lm_zoo.layers.products.aligned_contractions`).',
)
flags.DEFINE_bool(
  'held',
  False,
  "Also time each 'auto' and 'fused' recipe row with its train "
  "step holding the state past the window's own steps (NAME+held; "
  '`make_train_step(hold_padding=True)`).',
)
flags.DEFINE_integer(
  'tiny',
  0,
  '> 0: every model at this hidden size, batch 4, BPTT 5 '
  'and vocabulary 50 (a smoke test of the whole script, as CI runs it).',
)
flags.DEFINE_bool(
  'cudnn_reference',
  False,
  "Without a GPU, run jax_cudnn_lstm's row with "
  "jax.experimental.rnn's reference scan instead of skipping it (tests "
  'the code; not a speed figure).',
)
FLAGS = flags.FLAGS
VOCAB = 10_000  # PTB's; the papers' PTB recipes
TOP_KERNELS = 15  # the kernels a row's profile names, the longest in all first


def vocab_size() -> int:
  return 50 if FLAGS.tiny else VOCAB


def _narrowed(config):
  """`config` with bfloat16 products."""
  narrow = config.copy_and_resolve_references()
  narrow.model.dtype = 'bfloat16'
  return narrow


def _twins() -> bool:
  """Whether recipe rows get their NAME+bfloat16 twins."""
  return FLAGS.bfloat16 or FLAGS.bfloat16_only


def _refusal(config) -> str | None:
  """Why the recipe's model cannot be built with `config`, or None."""
  try:
    build_model(config.model, vocab_size())
  except ConfigError as err:  # a way the recipe's layers cannot run
    return str(err)
  return None


def recipe_rows(recipes: list[str], scans: list[str]) -> dict:
  """{row name: config} for every recipe and way its layers can run; with
  --bfloat16, a way that runs bfloat16 products only ('persistent') as its
  NAME+bfloat16 row alone."""
  rows = {}
  for recipe in recipes:
    for scan in scans:
      config = experiment_config(recipe, FLAGS.tiny)
      config.model.scan = scan
      name = recipe if scan == 'auto' else f'{recipe}@{scan}'
      refused = _refusal(config)
      if refused is None:
        rows[name] = config
        continue
      print(f'{name}: skipped, {refused}')
      narrow = _narrowed(config)
      if _twins() and config.model.dtype != 'bfloat16' and _refusal(narrow) is None:
        print(f'{name}+bfloat16: timed alone, with bfloat16 products')
        rows[f'{name}+bfloat16'] = narrow
  return rows


def build_baseline(name: str, hidden: int, batch: int, bptt: int) -> dict | None:
  if name == 'jax_cudnn_lstm':
    return jax_rnn_lm(
      hidden,
      vocab_size(),
      batch,
      bptt,
      reference=FLAGS.cudnn_reference and jax.default_backend() != 'gpu',
    )
  if name in TORCH_DTYPES:
    return torch_lm(name, hidden, vocab_size(), batch, bptt)
  config = experiment_config(FLAGS.recipes[0], FLAGS.tiny)  # flax_lstm: our loop, flax's cell
  config.model.update(
    cell='flax_lstm',
    init='default',  # the recipe's scheme may have no rule for flax's cell
    init_scale=0.0,
    num_layers=2,
    param_budget=0,
    hidden_size=hidden,
    embed_size=hidden,
    embed_ratio=-1.0,
    output_size=0,
    dtype='float32',
    tie_embeddings=False,
    skip_connections=False,
    cap_input_gate=False,
    recurrent_bias=False,
  )
  config.model.mogrifier.rounds = 0
  return lm_zoo_lm(config, vocab_size())


def build_row(name: str, build, failed: dict) -> dict | None:
  """`build()` (the row's compiled and warmed-up calls), or None with the
  reason in `failed[name]`: a kernel that does not compile or run on this
  device costs its own row, not the other rows' timings."""
  print(f'{name}: compiling', flush=True)  # a hang shows where
  try:
    return build()
  except Exception as err:  # any failure: the row's reason, not the run's end
    row_failed(name, err, failed)
    return None


def time_round(calls: dict, seconds: dict | None) -> dict:
  """One round of a row's timings, the best of them and `seconds` (the
  rounds before; None for none)."""
  best = seconds or {'train': float('inf'), 'eval': float('inf')}
  return {key: min(best[key], seconds_per_call(calls, key, FLAGS.steps)) for key in best}


def recipe_variants(configs: dict) -> dict:
  """{row: (its config, how to build it)} of every recipe row, and of its
  twins that --unpadded, --held and --bfloat16 ask for."""
  rows = {}
  for name, config in configs.items():
    narrow = config.model.dtype != 'bfloat16'
    if not (FLAGS.bfloat16_only and narrow):
      rows[name] = config, lambda config=config: lm_zoo_lm(config, vocab_size())
    if FLAGS.unpadded and config.model.scan in ('auto', 'fused'):

      def build(config=config):
        with aligned_contractions(1):  # traced in its warm-up
          return unpadded(lm_zoo_lm(config, vocab_size()))

      rows[f'{name}+unpadded'] = config, build
    if FLAGS.held and config.model.scan in ('auto', 'fused'):
      rows[f'{name}+held'] = (
        config,
        lambda config=config: lm_zoo_lm(config, vocab_size(), hold_padding=True),
      )
    if _twins() and narrow:
      twin = _narrowed(config)
      rows[f'{name}+bfloat16'] = twin, lambda twin=twin: lm_zoo_lm(twin, vocab_size())
  return rows


def unpadded(calls: dict) -> dict:
  """`calls` with its train step traced and run unaligned."""

  def inside(fn):
    def run(*args):
      with aligned_contractions(1):
        return fn(*args)

    return run

  return {k: inside(v) if k in ('train', 'eval', 'hlo') else v for k, v in calls.items()}


def count_kernels(built: dict) -> dict:
  """Kernels a train step (and the device's busy fraction, JAX rows), traced
  after the timing: profiling slows a step by up to 40% on a GPU."""
  kernels = {}
  for name, calls in built.items():
    if 'kernels' in calls:
      per_step = calls['kernels'](FLAGS.steps)
      kernels[name] = per_step and {'per_step': per_step}
      continue
    trace_dir = os.path.join(FLAGS.profile_dir, name.replace(':', '_').replace('@', '_'))
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    seconds_per_call(calls, 'train', FLAGS.steps)
    jax.profiler.stop_trace()
    traced = device_kernels(trace_dir)
    kernels[name] = traced and {
      'per_step': traced['kernels'] / FLAGS.steps,
      'busy': traced['busy_seconds'] / traced['span_seconds'],
      'top': top_kernels(traced, FLAGS.steps, 'step', TOP_KERNELS),
    }
  return kernels


def all_rows(configs: dict, recipe_hidden: int, batch: int, bptt: int) -> dict:
  """{row: (its config or None, how to build it, its hidden size)}: the
  baselines first, so that every row timed before a hang has its ratios."""
  rows = {}
  for size in FLAGS.baseline_hidden:
    hidden = recipe_hidden if size == 'recipe' else (FLAGS.tiny * 2 if FLAGS.tiny else int(size))
    for name in FLAGS.baselines:
      build = lambda name=name, hidden=hidden: build_baseline(name, hidden, batch, bptt)
      rows.setdefault(f'{name}@{hidden}', (None, build, hidden))
  for name, (config, build) in recipe_variants(configs).items():
    rows[name] = config, build, recipe_hidden
  return rows


def main(argv):
  del argv
  unknown = set(FLAGS.baselines) - set(BASELINES)
  if unknown:
    raise app.UsageError(f'unknown baselines {sorted(unknown)}: choose from {list(BASELINES)}')
  malloc = 'retained' if retain_host_memory() else 'system'  # off on GPU and TPU
  first = experiment_config(FLAGS.recipes[0], FLAGS.tiny)
  recipe_hidden = layer_sizes(build_model(first.model, vocab_size()))[0]
  batch, bptt = first.data.batch_size, first.data.bptt
  rows = all_rows(recipe_rows(FLAGS.recipes, FLAGS.scans), recipe_hidden, batch, bptt)
  built, seconds, failed, pads, kernels = {}, {}, {}, {}, {}
  recurrence = recurrence_matmul_seconds(recipe_hidden, batch, bptt)  # compiled and timed once

  def write(table: bool = False) -> None:
    """The report of every row timed so far (the JSON after each, the
    table at the end): a call cut short keeps what it measured."""
    results = [
      result_row(
        name,
        calls,
        first if rows[name][0] is None else rows[name][0],
        rows[name][2],
        seconds[name],
        recipe=rows[name][0] is not None,
        pads=pads,
        kernels=kernels,
      )
      for name, calls in built.items()
    ]
    add_ratios(results)
    report(
      results,
      recurrence,
      hidden=recipe_hidden,
      batch=batch,
      bptt=bptt,
      malloc=malloc,
      vocab=vocab_size(),
      failed=failed,
      output=FLAGS.output,
      baselines=FLAGS.baselines,
      scans=FLAGS.scans,
      table=table,
    )

  for name, (_, build, _) in rows.items():  # each row timed once as soon as it is built
    calls = build_row(name, build, failed)
    if calls is not None:
      built[name], seconds[name] = calls, time_round(calls, None)
    write()  # a failed row's reason too
  for _ in range(FLAGS.rounds - 1):  # the other rounds in turn: the best of them
    for name, calls in built.items():
      seconds[name] = time_round(calls, seconds[name])
    write()
  pads.update(write_hlo(built, FLAGS.hlo_dir) if FLAGS.hlo_dir else {})
  kernels.update(count_kernels(built) if FLAGS.profile_dir else {})
  write(table=True)
  if failed:
    raise SystemExit(
      f'error: {len(failed)} rows failed: {", ".join(failed)} (reasons above '
      'and in the output\'s "failed")'
    )


if __name__ == '__main__':
  app.run(main)
