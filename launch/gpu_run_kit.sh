#!/usr/bin/env bash
# The GPU run kit: on a fresh GPU host with JAX (CUDA) and no package index,
# installs lm_zoo's missing pure-Python dependencies from a folder of wheels,
# then runs the accelerator subset of the tests, the accelerator benchmark
# (benchmarks/accelerator_speed.py, with a profile) and MINUTES of the PTB
# Mogrifier paper recipe, and leaves every figure in OUT:
#
#   devices.txt, tests.txt, benchmark.json, benchmark.txt, profile/,
#   ptb_mogrifier.txt and the run's work directory ptb_mogrifier/ (its
#   metrics.jsonl holds tokens/s and the perplexity reached).
#
# TRAIN_CONFIG trains another recipe of experiments/ in the `train` part
# (TRAIN_CONFIG=alstm_paper.py:ptb: alstm_paper_ptb.txt, alstm_paper_ptb/),
# for its curve over MINUTES; run again into the same OUT, it resumes.
#
# These parts run only when KIT_PARTS names them. `kernels` checks and times
# the ways a layer can run a window (lm_zoo.cells.scans): the kernels'
# correctness subset on the device (kernel_tests.txt), the benchmark of every
# recipe under each scan beside cuDNN and PyTorch in every precision, with
# kernels a step and the longest ones by name (benchmark_scans.json,
# benchmark_scans.txt, profile_scans/, and each recipe row's optimized train
# step in hlo_scans/),
# the aLSTM recipe's LSTM-RHN stack under its fused window ('auto'), the
# same unpadded and holding its state (+held), and its plain scan beside
# cuDNN's LSTM of its size
# (benchmark_lstm_rhn.json, benchmark_lstm_rhn.txt, profile_lstm_rhn/,
# hlo_lstm_rhn/), the 24M LSTM and Mogrifier with bfloat16 products beside
# PyTorch in each dtype (benchmark_bfloat16.json, benchmark_bfloat16.txt),
# and dynamic evaluation's speed
# under each, with its longest kernels (dynamic_evaluation.json,
# dynamic_evaluation.txt, profile_dyneval/). Plan about 10 minutes of an
# H100 or H200 for it; the shortest benchmarks run first.
# `graphs` times the three paper recipes' train steps ('auto') beside cuDNN's
# LSTM, and dynamic evaluation, with XLA's command buffers (CUDA graphs)
# extended to loops (GRAPH_FLAGS, added to XLA_FLAGS): benchmark_graphs.json,
# dynamic_evaluation_graphs.json, each with its .txt, against the same rows
# of `kernels` (about 2 minutes).
# `agreement` trains AGREEMENT_STEPS updates of the 24M LSTM and Mogrifier
# recipes, Zaremba's small one and the small aLSTM's, from one seed, under each scan they take,
# and collects their validation perplexities (agreement.json, agreement.txt);
# AGREEMENT_RUNS picks other runs, 'CONFIG SCAN...' separated by ';' (say
# AGREEMENT_RUNS='ptb_lstm_small.py fused cudnn').
# `stacks` times stacks of
# seeds against a run alone (benchmarks/stacked_seeds.py: stacked_seeds.json,
# stacked_seeds.txt); `seeds` trains 8 seeds of Zaremba's medium recipe at
# once, bfloat16 products, until MINUTES of training in all
# (zaremba_medium.txt, zaremba_medium/). The whole recipe took 12 minutes of
# training on an H200, more than one 10-minute call: run `seeds` again into
# the same OUT, with a larger MINUTES, and it resumes. SEEDS_ARGS adds
# lm-zoo-train flags to it, which override the kit's (a variant of the
# recipe: give it its own OUT, or it would resume the other's stack).
# SEEDS_SIZE=large (or small) trains that Zaremba recipe instead, into
# zaremba_large/ (SEEDS_ARGS='--seeds=2', say: it is 5 times the medium's
# products a token and 55 epochs, so its curve as far as MINUTES reach).
# `persistent` first runs the grid barrier alone (grid_barrier.json and .txt,
# under `timeout 60`: if it hangs, the steps below skip every kernel that
# crosses it and say so in persistent_skipped.txt), then checks and times
# the persistent Mosaic GPU LSTM kernels, forward and backward
# (lm_zoo.kernels.persistent_lstm, persistent_lstm_backward: one launch a
# window each way, a barrier across the grid a step) in each mode against
# XLA's window and cuDNN's at the 24M LSTM's size, and what a crossing of
# the grid barrier alone costs, 11 a step, and whether it holds
# (benchmarks/persistent_probe.py: persistent_probe.json and .txt; under
# `timeout 150`, as a kernel whose blocks wait for each other may hang, and
# its JSON keeps every row measured before), then the persistent Mogrifier
# kernels against the fused window, one layer of the 24M recipe forward and
# with its gradients, a launch a phase, on 116 blocks and on 120
# (benchmarks/persistent_mogrifier_probe.py: persistent_mogrifier_probe.json
# and .txt; under `timeout 150`), then the 24M LSTM and Mogrifier recipes'
# train steps with bfloat16 products under scan 'auto' and 'persistent'
# beside PyTorch's bfloat16 rows, with kernels a step
# (benchmark_persistent.json and .txt, profile_persistent/; under
# `timeout 240`), then tests/test_persistent_scan.py and
# tests/test_persistent_mogrifier_window.py (compiled on a GPU:
# scan='persistent' in a model with a state mask against 'fused';
# persistent_tests.txt, under `timeout 120`), then dynamic evaluation at
# 2 x 650, batch 1, with bfloat16 products, fused and persistent
# (dynamic_evaluation_persistent.json and .txt, profile_dyneval_persistent/;
# under `timeout 120`). Every benchmark and probe rewrites its JSON after
# each row, and a failed row's whole error and traceback are in its .txt.
# `dyneval` and `mogrifier24m` run the seed studies of
# experiments/paper_seed_studies.py (4 seeds stacked): Zaremba's medium model,
# then RMS and SGD dynamic evaluation of each seed on the whole valid and
# test, every seed's runs in shared scans (dyneval.json, dyneval.txt,
# dyneval/), then dynamic evaluation's speed with 1, 4 and 24 runs a scan,
# as the study runs them (dyneval_members.json and .txt); the 24M LSTM and Mogrifier
# recipes for MINUTES/2 of training each, then valid and test
# (mogrifier24m.json, mogrifier24m.txt, mogrifier24m/). Run again into the
# same OUT, a study reads back what it finished and goes on.
#
#   launch/gpu_run_kit.sh [OUT]          # OUT defaults to runs/gpu_kit
#
# Environment: WHEELS, the folder of wheels (default .whl; docs/usage.md says
# how to fill it); LM_ZOO_DATA, the data folder (PTB at least); MINUTES of
# training (default 10); KIT_PARTS, which parts to run, in the order named
# (default "tests benchmark train": a host lent for short spells can run them
# in turns into one OUT, and add "stacks" and "seeds"); KIT_TINY=1 runs
# everything at a tiny size, on any machine (CI runs it so on a CPU).
# launch/gpu_kit_background.sh runs the kit detached, for hosts lent in calls
# shorter than the kit.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_kit}
WHEELS=${WHEELS:-.whl}
MINUTES=${MINUTES:-10}
PYTHON=${PYTHON:-python3}
PARTS=" $(echo ${KIT_PARTS:-tests benchmark train}) "  # any blanks: single spaces
for part in $PARTS; do
  case $part in tests|benchmark|train|kernels|graphs|agreement|stacks|seeds|dyneval|mogrifier24m|persistent) ;; *)
    echo "error: KIT_PARTS: unknown part '$part'; choose from: tests benchmark train kernels graphs agreement stacks seeds dyneval mogrifier24m persistent" >&2
    exit 2;;
  esac
done
case ${SEEDS_SIZE:-medium} in small|medium|large) ;; *)
  echo "error: SEEDS_SIZE: unknown size '$SEEDS_SIZE'; choose from: small medium large" >&2
  exit 2;;
esac
mkdir -p "$OUT"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  site=$(mktemp -d)
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1

# The tests whose numbers a device computes: cells, scans and fused kernels,
# mixed precision, models, training steps.
tests=(tests/test_lstm.py tests/test_lstm_recurrence.py tests/test_mixed_lstm_recurrence.py
       tests/test_scans.py tests/test_window_kernels.py
       tests/test_mogrifier.py tests/test_alstm.py tests/test_language_model.py tests/test_stacks.py
       tests/test_mixture_of_softmaxes.py tests/test_dual.py tests/test_regularisation.py)
bench=()
# Every kernel test, those marked slow too: interpreted on a CPU they take
# tens of seconds, compiled on the GPU they do not.
kernel_tests=(-m 'slow or not slow' tests/test_lstm_step.py tests/test_pallas_lstm.py
              tests/test_mogrifier_rounds.py tests/test_pallas_mogrifier.py
              tests/test_pallas_alstm.py tests/test_lstm_rhn_recurrence.py
              tests/test_cudnn_lstm.py tests/test_lstm.py tests/test_held_steps.py)
# 'auto' is each recipe's way today (the fused windows, the paper's aLSTM's
# LSTM-RHN stack's included). ptb_alstm_small:recurrent is the aLSTM whose
# layers take the Pallas kernel (an eq. 7 latent each, none dropped).
kernel_bench=(--recipes=mogrifier_paper:ptb_lstm,mogrifier_paper:ptb_mogrifier,alstm_paper:ptb,ptb_alstm_small:recurrent
              --scans=auto,pallas --steps=10 --rounds=2
              --baselines=jax_cudnn_lstm,torch_lstm,torch_lstm_bf16_autocast,torch_lstm_fp16,torch_lstm_bf16)
# Each recipe row's train step as XLA compiled it (what its kernels are).
hlo=(--hlo_dir="$OUT/hlo_scans")
# The LSTM-RHN stack's fused window against the plain scan it replaced, at the
# recipe's size, against itself with its weights unpadded (XLA then pads
# them inside the loop: hlo_lstm_rhn/ and each row's hlo_loop_pads show it),
# and holding the state past a window's own steps (what padding the recipe's
# variable windows, data.pad_windows_to, costs a step).
rhn_bench=(--recipes=alstm_paper:ptb --scans=auto,scan --steps=10 --rounds=2 --unpadded --held
           --baselines=jax_cudnn_lstm --baseline_hidden=recipe --hlo_dir="$OUT/hlo_lstm_rhn")
# The 24M recipes with bfloat16 products beside PyTorch's rows of each dtype.
bf16_bench=(--recipes=mogrifier_paper:ptb_lstm,mogrifier_paper:ptb_mogrifier --scans=auto
            --bfloat16 --steps=10 --rounds=2 --baseline_hidden=recipe
            --baselines=jax_cudnn_lstm,torch_lstm,torch_lstm_bf16_autocast,torch_lstm_bf16)
dynamic=(--sizes=650 --tokens=1000 --scans=fused,pallas,cudnn  # ratios against 'fused'
         --profile_dir="$OUT/profile_dyneval")
# XLA's command buffers (CUDA graphs) by default hold runs of kernels but not
# loops; with WHILE and CONDITIONAL a scan's whole loop is one graph, which
# may cut the launches that bound the recurrences' steps.
GRAPH_FLAGS=${GRAPH_FLAGS:---xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL}
graph_bench=(--recipes=mogrifier_paper:ptb_lstm,mogrifier_paper:ptb_mogrifier,alstm_paper:ptb
             --scans=auto --steps=10 --rounds=2 --baselines=jax_cudnn_lstm --baseline_hidden=recipe)
graph_dynamic=(--sizes=650 --tokens=1000 --scans=fused)
AGREEMENT_STEPS=${AGREEMENT_STEPS:-200}
agreement=(--config.train.max_steps=$AGREEMENT_STEPS --config.train.eval_every=0
           --config.evaluation.splits=valid --config.data.valid_tokens=20000
           --config.generate.num_lines=0)
agreement_runs=("mogrifier_paper.py:ptb_lstm fused pallas"
                "mogrifier_paper.py:ptb_mogrifier fused pallas"
                "ptb_lstm_small.py fused pallas cudnn"
                "ptb_alstm_small.py:recurrent fused pallas")
# A curve of MINUTES: variable windows padded to multiples of 8 steps, so
# that the train step compiles about 10 times rather than once per length.
train=(--config.train.max_seconds=$((MINUTES * 60)) --config.evaluation.splits=valid
       --config.data.pad_windows_to=8)
stacks=(--recipe=ptb_lstm_medium --seeds=1,2,4,8)
persistent=()  # the probe's defaults: hidden 951, batch 64, 70 steps
mogrifier_probe=(--blocks=120)  # and on 120 blocks: n_pad 960, chunks of 96 columns
# scan='persistent' in a model against 'fused' (compiled on a GPU: the masked
# kernels, the LSTM's and the Mogrifier's)
persistent_tests=(tests/test_persistent_scan.py tests/test_persistent_mogrifier_window.py)
# The 24M LSTM and Mogrifier recipes (state dropout included) with bfloat16
# products only (the `kernels` part has their float32 rows), their windows
# fused ('auto') and persistent, beside PyTorch's bfloat16 rows, with kernels
# a step (profile_persistent/).
persistent_bench=(--recipes=mogrifier_paper:ptb_lstm,mogrifier_paper:ptb_mogrifier
                  --scans=auto,persistent --bfloat16_only
                  --steps=10 --rounds=2 --baseline_hidden=recipe
                  --baselines=jax_cudnn_lstm,torch_lstm_bf16_autocast,torch_lstm_bf16
                  --profile_dir="$OUT/profile_persistent")
# Dynamic evaluation (batch 1) with bfloat16 products, fused and persistent
# (the persistent kernels multiply in bfloat16 only): the `kernels` part's
# float32 rows are the ratios' baseline.
persistent_dynamic=(--sizes=650 --tokens=1000 --scans=fused,persistent --dtype=bfloat16
                    --rules=dynamic_sgd,dynamic_rms --profile_dir="$OUT/profile_dyneval_persistent")
seeds=(--config.model.dtype=bfloat16 --seeds=8 --config.train.max_seconds=$((MINUTES * 60)))
read -r -a seeds_args <<< "${SEEDS_ARGS:-}"  # words, not globbed
dyneval=(--config=experiments/paper_seed_studies.py:zaremba_medium_dyneval)
# the study's runs a scan: a seed alone, its 4 seeds, 4 seeds x 6 RMS settings
dyneval_members=(--sizes=650 --tokens=1000 --scans=fused --dtype=bfloat16
                 --rules=dynamic_sgd,dynamic_rms --members=1,4,24)
mogrifier24m=(--config=experiments/paper_seed_studies.py:mogrifier_24m
              --config.models.lstm.train.max_seconds=$((MINUTES * 30))
              --config.models.mogrifier.train.max_seconds=$((MINUTES * 30)))
if [ "${KIT_TINY:-0}" = 1 ]; then
  tests=(tests/test_lstm.py -k test_step_matches_numpy_equations)
  kernel_tests=(tests/test_lstm_step.py -k forward_step_is_the_lstm_step)
  kernel_bench=(--tiny=16 --steps=1 --rounds=1 --recipes=mogrifier_paper:ptb_lstm
                --scans=pallas --baselines=jax_cudnn_lstm --baseline_hidden=recipe)
  rhn_bench=(--tiny=16 --steps=1 --rounds=1 --recipes=alstm_paper:ptb --scans=auto
             --baselines=jax_cudnn_lstm --baseline_hidden=recipe)
  hlo=()
  bf16_bench=()  # the tiny `benchmark` part times a bfloat16 twin: one process fewer
  dynamic=(--sizes=16 --vocab=50 --tokens=10 --scans=pallas --rules=dynamic_rms
           --profile_dir="$OUT/profile_dyneval")
  graph_bench=(--tiny=16 --steps=1 --rounds=1 --recipes=mogrifier_paper:ptb_lstm --scans=auto
               --baselines=jax_cudnn_lstm --baseline_hidden=recipe)
  graph_dynamic=(--sizes=16 --vocab=50 --tokens=10 --scans=fused --rules=dynamic_sgd)
  agreement=(--config.train.max_steps=2 --config.train.eval_every=0
             --config.model.param_budget=0 --config.model.hidden_size=16
             --config.model.embed_size=16 --config.data.batch_size=4 --config.data.bptt=5
             --config.data.train_tokens=2000 --config.data.valid_tokens=200
             --config.evaluation.splits=valid --config.generate.num_lines=0)
  agreement_runs=("ptb_lstm_small.py fused pallas")
  bench=(--tiny=16 --steps=1 --rounds=1 --recipes=mogrifier_paper:ptb_mogrifier
         --scans=auto,cudnn --baselines=jax_cudnn_lstm,flax_lstm --baseline_hidden=recipe
         --bfloat16)
  train=(--config.train.max_steps=4 --config.train.eval_every=0 --config.model.param_budget=0
         --config.model.hidden_size=16 --config.model.mogrifier.rank=4
         --config.data.batch_size=4 --config.data.bptt=5 --config.data.train_tokens=2000
         --config.data.valid_tokens=200 --config.evaluation.splits=valid
         --config.generate.num_lines=0)
  stacks=(--tiny=8 --seeds=1,2 --steps=1 --rounds=1)
  persistent=(--tiny)
  mogrifier_probe=(--tiny --blocks=1)
  persistent_tests=(tests/test_persistent_scan.py -k refused)
  # `auto` is timed by the benchmark and graphs parts: here only the persistent rows
  persistent_bench=(--tiny=16 --steps=1 --rounds=1 --recipes=mogrifier_paper:ptb_lstm
                    --scans=persistent --bfloat16_only --baselines=jax_cudnn_lstm
                    --baseline_hidden=recipe)  # no profile: 80 s interpreted, 1 s on a GPU
  # interpreted, a persistent row takes 15 s: the tiny run checks the flags
  persistent_dynamic=(--sizes=16 --vocab=50 --tokens=10 --scans=fused --dtype=bfloat16
                      --rules=dynamic_sgd)
  # Whole windows of the recipe's 20 x 35 batch and batch-1 test: one step shape each.
  tiny_study() {  # MODEL: the flags that make a study's model tiny
    local m=--config.models.$1
    echo "$m.train.max_steps=2 $m.train.eval_every=0 $m.model.param_budget=0" \
         "$m.model.hidden_size=16 $m.model.embed_size=16 $m.data.batch_size=4 $m.data.bptt=5" \
         "$m.train.num_epochs=1 $m.data.train_tokens=41 $m.data.valid_tokens=121" \
         "$m.data.test_tokens=81"
  }
  # shellcheck disable=SC2207  # the flags are words without blanks or globs
  dyneval=(--config=experiments/paper_seed_studies.py:zaremba_medium_dyneval
           --config.seeds='(0, 1)' $(tiny_study lstm_medium)
           --config.evaluations.rms.dynamic.learning_rate='(1e-4,)'
           --config.evaluations.rms.dynamic.decay='(1e-3,)'
           --config.evaluations.rms.dynamic.ms_batches=2
           --config.evaluations.rms.dynamic.ms_batch_size=4
           --config.evaluations.sgd.dynamic.learning_rate='(1e-2,)'
           --config.evaluations.rms.splits=test --config.evaluations.sgd.splits=test)
  dyneval_members=(--sizes=16 --vocab=50 --tokens=10 --scans=fused --rules=dynamic_rms
                   --members=1,2)
  # shellcheck disable=SC2207
  mogrifier24m=(--config=experiments/paper_seed_studies.py:mogrifier_24m
                --config.seeds='(0, 1)' $(tiny_study lstm) $(tiny_study mogrifier)
                --config.models.mogrifier.model.mogrifier.rank=4)
  seeds=(--seeds=2 --config.train.max_steps=4 --config.model.hidden_size=16
         --config.model.embed_size=16 --config.data.train_tokens=2101
         --config.data.valid_tokens=200 --config.data.test_tokens=176)
fi

if [ -n "${AGREEMENT_RUNS:-}" ]; then
  IFS=';' read -r -a agreement_runs <<< "$AGREEMENT_RUNS"
fi

# Each step runs whatever the one before did: a GPU's time is rare.
failed=()
"$PYTHON" -c 'import jax; print(jax.__version__, jax.devices())' 2>&1 \
    | tee "$OUT/devices.txt" || failed+=(devices)
part_tests() {
  # In parallel where pytest-xdist is installed: one at a time the subset had
  # run 130 of its 172 tests in 370 s on an H100; 6 workers took 100 s. The
  # workers share the device, so none takes JAX's default 75% of its memory.
  local workers=()
  if [ "${KIT_TINY:-0}" != 1 ] && "$PYTHON" -c 'import xdist' 2>/dev/null; then
    workers=(-n "${KIT_TEST_WORKERS:-6}")
  fi
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$PYTHON" -m pytest -q -p no:cacheprovider \
      ${workers[@]+"${workers[@]}"} "${tests[@]}" 2>&1 | tee "$OUT/tests.txt" || failed+=(tests)
}
part_benchmark() {
  "$PYTHON" benchmarks/accelerator_speed.py --output="$OUT/benchmark.json" \
      --profile_dir="$OUT/profile" ${bench[@]+"${bench[@]}"} 2>&1 | tee "$OUT/benchmark.txt" \
      || failed+=(benchmark)
}
part_train() {
  local recipe run
  recipe=${TRAIN_CONFIG:-mogrifier_paper.py:ptb_mogrifier}
  run=ptb_mogrifier
  if [ -n "${TRAIN_CONFIG:-}" ]; then
    run=${TRAIN_CONFIG/.py/}  # alstm_paper.py:ptb -> alstm_paper_ptb
    run=${run//:/_}
  fi
  "$PYTHON" launch/train.py --config="experiments/$recipe" \
      --workdir="$OUT/$run" "${train[@]}" 2>&1 | tee "$OUT/$run.txt" || failed+=("$run")
}
part_kernels() {
  local workers=()
  if [ "${KIT_TINY:-0}" != 1 ] && "$PYTHON" -c 'import xdist' 2>/dev/null; then
    workers=(-n "${KIT_TEST_WORKERS:-6}")
  fi
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$PYTHON" -m pytest -q -p no:cacheprovider \
      ${workers[@]+"${workers[@]}"} "${kernel_tests[@]}" 2>&1 | tee "$OUT/kernel_tests.txt" \
      || failed+=(kernel_tests)
  # the shortest first: a lent machine may go back before the end
  "$PYTHON" benchmarks/accelerator_speed.py --output="$OUT/benchmark_lstm_rhn.json" \
      --profile_dir="$OUT/profile_lstm_rhn" "${rhn_bench[@]}" 2>&1 \
      | tee "$OUT/benchmark_lstm_rhn.txt" || failed+=(benchmark_lstm_rhn)
  if [ ${#bf16_bench[@]} -gt 0 ]; then
    "$PYTHON" benchmarks/accelerator_speed.py --output="$OUT/benchmark_bfloat16.json" \
        "${bf16_bench[@]}" 2>&1 | tee "$OUT/benchmark_bfloat16.txt" || failed+=(benchmark_bfloat16)
  fi
  "$PYTHON" benchmarks/accelerator_speed.py --output="$OUT/benchmark_scans.json" \
      --profile_dir="$OUT/profile_scans" ${hlo[@]+"${hlo[@]}"} "${kernel_bench[@]}" 2>&1 \
      | tee "$OUT/benchmark_scans.txt" || failed+=(benchmark_scans)
  "$PYTHON" benchmarks/dynamic_evaluation_speed.py --output="$OUT/dynamic_evaluation.json" \
      "${dynamic[@]}" 2>&1 | tee "$OUT/dynamic_evaluation.txt" || failed+=(dynamic_evaluation)
}
part_graphs() {
  XLA_FLAGS="${XLA_FLAGS:-} $GRAPH_FLAGS" "$PYTHON" benchmarks/accelerator_speed.py \
      --output="$OUT/benchmark_graphs.json" "${graph_bench[@]}" 2>&1 \
      | tee "$OUT/benchmark_graphs.txt" || failed+=(benchmark_graphs)
  XLA_FLAGS="${XLA_FLAGS:-} $GRAPH_FLAGS" "$PYTHON" benchmarks/dynamic_evaluation_speed.py \
      --output="$OUT/dynamic_evaluation_graphs.json" "${graph_dynamic[@]}" 2>&1 \
      | tee "$OUT/dynamic_evaluation_graphs.txt" || failed+=(dynamic_evaluation_graphs)
}
part_agreement() {
  local run config scans scan
  for run in "${agreement_runs[@]}"; do
    read -r config scans <<< "$run"
    for scan in $scans; do
      "$PYTHON" launch/train.py --config="experiments/$config" --config.model.scan="$scan" \
          --workdir="$OUT/agreement/${config//[.:]/_}@$scan" "${agreement[@]}" 2>&1 \
          | tail -3 || failed+=("agreement $config@$scan")
    done
  done
  "$PYTHON" - "$OUT" <<'COLLECT' 2>&1 | tee "$OUT/agreement.txt" || failed+=(agreement)
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {}
for summary in sorted((out / 'agreement').glob('*/summary.json')):
  s = json.loads(summary.read_text())
  runs[summary.parent.name] = {'valid_perplexity': s['valid']['perplexity'], 'step': s['step'],
                               'tokens_per_second': s['tokens_per_second']}
  print(f"{summary.parent.name:>45} step {s['step']:>5} valid {s['valid']['perplexity']:.6f}")
(out / 'agreement.json').write_text(json.dumps(runs, indent=2))
COLLECT
}
part_stacks() {
  "$PYTHON" benchmarks/stacked_seeds.py --output="$OUT/stacked_seeds.json" "${stacks[@]}" 2>&1 \
      | tee "$OUT/stacked_seeds.txt" || failed+=(stacked_seeds)
}
part_seeds() {
  local size
  size=${SEEDS_SIZE:-medium}
  "$PYTHON" launch/train.py --config="experiments/ptb_lstm_$size.py" \
      --workdir="$OUT/zaremba_$size" "${seeds[@]}" ${seeds_args[@]+"${seeds_args[@]}"} 2>&1 \
      | tee "$OUT/zaremba_$size.txt" || failed+=("zaremba_$size")
}
part_persistent() {
  # The grid barrier alone first, in seconds: where its blocks are not all
  # resident, every kernel that crosses it would hang until its timeout, so
  # when it times out the rest runs without them (any other failure is the
  # probe's own: the rest runs, each row failing on its own). Each step's
  # timeout is its cap; together about 14 minutes, most used only on a hang,
  # the steps ordered by what the results need first. -k: a process stuck in
  # the driver is killed 10 s after the TERM.
  local skip=(--skip_rows=barrier_persistent) rc=0 hung=0
  timeout -k 10 60 "$PYTHON" benchmarks/persistent_probe.py --rows=barrier_persistent \
      --output="$OUT/grid_barrier.json" ${persistent[@]+"${persistent[@]}"} 2>&1 \
      | tee "$OUT/grid_barrier.txt" || rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    failed+=(grid_barrier)
  fi
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    hung=1
    skip=(--skip_rows=unfenced,persistent,grad_persistent,barrier_unfenced,barrier_persistent)
  fi
  # MOSAIC_GPU_DUMP_PTXAS: ptxas' report of each kernel in the .txt (registers,
  # spills, and whether it serialised the wgmmas: warning C7510)
  MOSAIC_GPU_DUMP_PTXAS=1 timeout -k 10 150 "$PYTHON" benchmarks/persistent_probe.py \
      --output="$OUT/persistent_probe.json" ${persistent[@]+"${persistent[@]}"} \
      "${skip[@]}" 2>&1 | tee "$OUT/persistent_probe.txt" || failed+=(persistent_probe)
  if [ "$hung" = 1 ]; then
    echo "skipped: every kernel that crosses the grid barrier (the Mogrifier probe," \
         "benchmark_persistent, persistent_tests, dynamic_evaluation_persistent):" \
         "the barrier alone did not end in 60 s (grid_barrier.txt)" \
        | tee "$OUT/persistent_skipped.txt"
    return
  fi
  MOSAIC_GPU_DUMP_PTXAS=1 timeout -k 10 150 "$PYTHON" benchmarks/persistent_mogrifier_probe.py \
      --output="$OUT/persistent_mogrifier_probe.json" "${mogrifier_probe[@]}" 2>&1 \
      | tee "$OUT/persistent_mogrifier_probe.txt" || failed+=(persistent_mogrifier_probe)
  # the recipes' speed before the model-level tests: the probes have checked
  # the kernels' answers, and a lent machine may go back before the end
  timeout -k 10 240 "$PYTHON" benchmarks/accelerator_speed.py \
      --output="$OUT/benchmark_persistent.json" "${persistent_bench[@]}" 2>&1 \
      | tee "$OUT/benchmark_persistent.txt" || failed+=(benchmark_persistent)
  timeout -k 10 120 "$PYTHON" -m pytest -q -p no:cacheprovider "${persistent_tests[@]}" 2>&1 \
      | tee "$OUT/persistent_tests.txt" || failed+=(persistent_tests)
  timeout -k 10 120 "$PYTHON" benchmarks/dynamic_evaluation_speed.py \
      --output="$OUT/dynamic_evaluation_persistent.json" "${persistent_dynamic[@]}" 2>&1 \
      | tee "$OUT/dynamic_evaluation_persistent.txt" || failed+=(dynamic_evaluation_persistent)
}
# the seed studies of experiments/paper_seed_studies.py: STUDY names its flags
run_study() {
  local -n flags=$1
  "$PYTHON" launch/run_task.py "${flags[@]}" --config.workdir="$OUT/$1" \
      --output="$OUT/$1.json" 2>&1 | tee "$OUT/$1.txt" || failed+=("$1")
}
part_dyneval() {
  run_study dyneval
  "$PYTHON" benchmarks/dynamic_evaluation_speed.py --output="$OUT/dyneval_members.json" \
      "${dyneval_members[@]}" 2>&1 | tee "$OUT/dyneval_members.txt" || failed+=(dyneval_members)
}
part_mogrifier24m() { run_study mogrifier24m; }

# The parts in the order KIT_PARTS names them: a lent machine may go back
# before the last.
for part in $PARTS; do
  "part_$part"
done
echo "every figure is in $OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]} (their output is in $OUT)" >&2
  exit 1
fi
