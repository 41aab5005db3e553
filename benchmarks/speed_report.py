"""The output of accelerator_speed.py: each timed row's figures (rates,
FLOPs, compilation, profile, the hours its recipe implies), and the table
and JSON file they are written to."""

import functools
import json
import os
import pathlib

import jax
from baselines import BASELINE_DTYPES

from lm_zoo.data import load_corpus


@functools.cache
def _corpus_tokens(name: str, data_dir: str) -> int | None:
  """The training split's tokens of corpus `name`, None without the data
  (said once a corpus: every write of a report asks again)."""
  try:
    return len(load_corpus(name, data_dir or os.environ.get('LM_ZOO_DATA') or None).train)
  except Exception as err:  # the corpus is not here: no hours for this recipe
    print(f'{name}: no hours implied ({err})')
    return None


def recipe_tokens(config) -> int | None:
  """Tokens the recipe trains on: its updates x batch x BPTT (max_steps),
  else its epochs over the corpus's training split (None without the data)."""
  data = config.data
  if config.train.max_steps > 0:
    return config.train.max_steps * data.batch_size * data.bptt
  tokens = _corpus_tokens(data.name, data.data_dir)
  return None if tokens is None else config.train.num_epochs * tokens


def result_row(
  name: str,
  calls: dict,
  config,
  hidden: int,
  seconds: dict,
  *,
  recipe: bool,
  pads: dict,
  kernels: dict,
) -> dict:
  """The figures of row `name`, timed at `seconds` ({'train', 'eval'}) a
  step on `config`'s batch; `recipe`: a recipe row (else a baseline), with
  its scan, dtype and the hours its whole training implies."""
  tokens = config.data.batch_size * config.data.bptt
  train, evaluate = seconds['train'], seconds['eval']
  row = {
    'row': name,
    'hidden': hidden,
    'train_seconds': train,
    'eval_seconds': evaluate,
    'train_ms_per_step': train * 1e3,
    'train_tokens_per_s': tokens / train,
    'eval_tokens_per_s': tokens / evaluate,
    'batch_size': config.data.batch_size,
    'bptt': config.data.bptt,
    **{k: calls[k] for k in ('model', 'library') if k in calls},
    'matmul_params': calls['matmul_params'],
  }
  if recipe:
    row['scan'], row['dtype'] = config.model.scan, config.model.dtype
  else:
    row['dtype'] = BASELINE_DTYPES[name.split('@')[0]]
  if name in pads:
    row['hlo_loop_pads'] = pads[name]
  if 'first_call_seconds' in calls:
    row['train_first_call_seconds'] = calls['first_call_seconds']['train']
    row['eval_first_call_seconds'] = calls['first_call_seconds']['eval']
  row['train_step_flops'] = 6 * calls['matmul_params'] * tokens
  row['train_tflops_per_s'] = row['train_step_flops'] / train / 1e12
  if kernels.get(name):
    row['profile_kernels_per_step'] = kernels[name]['per_step']
    if 'busy' in kernels[name]:
      row['profile_device_busy'] = kernels[name]['busy']
      row['profile_top_kernels'] = kernels[name]['top']
  total = recipe_tokens(config) if recipe else None
  if total is not None:
    row['recipe_tokens'] = total
    row['recipe_hours'] = total / row['train_tokens_per_s'] / 3600
  return row


def _print_table(
  rows: list[dict], recurrence: float, device, *, hidden, batch, bptt, malloc, vocab
) -> None:
  print(
    f'\n{device.platform}: {device.device_kind} x {jax.device_count()}; '
    f'{os.cpu_count()} CPUs; malloc {malloc}; vocabulary {vocab}'
  )
  print(
    f'recurrent products of one {batch} x {bptt} window at hidden {hidden} (2 layers, '
    f'forward only): {recurrence * 1e3:.2f} ms'
  )
  print(
    f'{"row":>42} {"train tok/s":>11} {"eval tok/s":>10} {"ms/step":>7} {"kernels":>7} '
    f'{"hours":>6} {"train/cuDNN":>11} {"train/torch":>11}'
  )
  nan = float('nan')
  for r in rows:
    print(
      f'{r["row"]:>42} {r["train_tokens_per_s"]:>11,.0f} {r["eval_tokens_per_s"]:>10,.0f} '
      f'{r["train_ms_per_step"]:>7.2f} {r.get("profile_kernels_per_step", nan):>7,.0f} '
      f'{r.get("recipe_hours", nan):>6.2f} {r.get("train_vs_cudnn", nan):>11.2f} '
      f'{r.get("train_vs_torch_fastest", nan):>11.2f}'
    )


def report(
  rows: list[dict],
  recurrence: float,
  *,
  hidden: int,
  batch: int,
  bptt: int,
  malloc: str,
  vocab: int,
  failed: dict,
  output: str,
  baselines: list[str],
  scans: list[str],
  table: bool = True,
) -> None:
  """Prints the rows as a table (with `table`) and, when `output` names a
  file, writes them there as JSON with the device, the run's settings and
  the failed rows."""
  device = jax.devices()[0]
  if table:
    sizes = dict(hidden=hidden, batch=batch, bptt=bptt)
    _print_table(rows, recurrence, device, **sizes, malloc=malloc, vocab=vocab)
  if output:
    path = pathlib.Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
      json.dumps(
        {
          'device': str(device),
          'device_kind': device.device_kind,
          'platform': device.platform,
          'devices': jax.device_count(),
          'cpus': os.cpu_count(),
          'malloc': malloc,
          'vocab': vocab,
          'recipe_hidden': hidden,
          'recurrence_matmul_seconds': recurrence,
          'baselines': baselines,
          'scans': scans,
          'jax': jax.__version__,
          'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'results': rows,
          'failed': failed,
        },
        indent=2,
      )
    )
    if table:
      print(f'wrote {path}')
