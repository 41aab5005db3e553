"""What the speed benchmarks time: our LMs as their training loop builds them
(`lm_zoo_lm`), the baselines, and the timing.

Each builder returns the calls one benchmark row times: `train()` (one
update), `eval()` (the loss of one window) and `sync(out)` (waits for the
work `out` stands for), compiled and warmed up; or None, after printing why
the row is skipped (its library is not installed, or it needs a GPU).
Every baseline LM is embedding -> 2-layer LSTM -> softmax with embedding = hidden
size, SGD (learning rate 1) with the gradient norm clipped at 5, the state
carried across windows, on a fixed random batch.

Each row also carries `matmul_params`, the parameters a token's forward pass
multiplies by (all of them but an untied input embedding, which is only
looked up): a train step costs about 6 x that x its tokens in FLOPs (forward 2,
backward 4 per weight and token), the usual model-FLOPs count. XLA's cost
analysis is no substitute: it counts a scan's loop body once, not once per
step (0.12 TFLOP/s for the 24M Mogrifier on an H100 by it).
"""

from __future__ import annotations

import importlib
import math
import os
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
from timing import best_seconds


def random_batch(vocab: int, batch: int, bptt: int) -> tuple[np.ndarray, np.ndarray]:
  """Inputs and targets of one window, (batch, bptt) int32 ids."""
  rng = np.random.default_rng(0)
  shape = (batch, bptt)
  return (
    rng.integers(0, vocab, shape).astype(np.int32),
    rng.integers(0, vocab, shape).astype(np.int32),
  )


def experiment_config(recipe: str, tiny: int = 0):
  """The config of `NAME[:VARIANT]` of lm_zoo/experiments; with `tiny` > 0
  its model at that hidden size (low-rank factors and latent sizes capped to
  fit), batch 4, BPTT 5, fixed-length windows."""
  name, _, variant = recipe.partition(':')
  module = importlib.import_module(f'lm_zoo.experiments.{name}')
  config = module.get_config(*([variant] if variant else []))
  if tiny:
    config.model.update(
      param_budget=0, hidden_size=tiny, embed_size=tiny, embed_ratio=-1.0, output_size=0
    )
    if config.model.mogrifier.rank > 0:
      config.model.mogrifier.rank = min(config.model.mogrifier.rank, tiny // 2)
    config.model.alstm.latent_size = min(config.model.alstm.latent_size, tiny)
    config.data.update(batch_size=4, bptt=5, variable_bptt=False)
  return config


def lm_zoo_lm(config, vocab: int, num_seeds: int = 0, hold_padding: bool = False) -> dict:
  """Our LM of `config` with the train step its loop builds (losses,
  regularisers, state drop, optimizer), on a random batch of the config's
  size, and its `matmul_params`. With `num_seeds` > 0, seeds config.seed,
  ... stacked as `lm-zoo-train --seeds` trains them
  (`make_train_step(stacked=True)`), their steps timed as one. With
  `hold_padding`, the step holds the state past the window's own steps (as
  for padded variable windows; here every step is its own)."""
  from lm_zoo.evaluation import make_eval_step
  from lm_zoo.models import build_model, describe_model
  from lm_zoo.training import create_train_state, make_optimizer, make_train_step
  from lm_zoo.training.seed_axis import seed_configs, stack

  model = build_model(config.model, vocab)
  optimizer = make_optimizer(config.optimizer, config.averaging.trigger)
  stacked = num_seeds > 0
  train_step = make_train_step(
    model,
    optimizer,
    config.optimizer.loss_reduction == 'sum_over_time',
    config.optimizer.ar,
    config.optimizer.tar,
    drop_state=config.train.drop_state,
    stacked=stacked,
    hold_padding=hold_padding,
  )
  eval_step = make_eval_step(model, stacked=stacked)
  inputs, targets = random_batch(vocab, config.data.batch_size, config.data.bptt)
  weights = np.ones(inputs.shape, np.float32)
  states = [
    create_train_state(model, optimizer, seeded)
    for seeded in seed_configs(config, max(num_seeds, 1))
  ]
  holder = {'state': stack(states) if stacked else states[0]}
  params = states[0].params
  matmul_params = sum(x.size for x in jax.tree.leaves(params))
  if not config.model.tie_embeddings:
    matmul_params -= params['embedding']['embedding'].size

  def train():
    holder['state'], metrics = train_step(holder['state'], inputs, targets, weights)
    return metrics['loss']

  def evaluate():
    state = holder['state']
    return eval_step(state.params, state.carries, inputs, targets, weights)[0]

  def optimized_hlo() -> str:
    return train_step.lower(holder['state'], inputs, targets, weights).compile().as_text()

  first_call = {}  # each compiles here: what a run waits for before its first step
  for key, fn in (('train', train), ('eval', evaluate)):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first_call[key] = time.perf_counter() - start
  return {
    'train': train,
    'eval': evaluate,
    'sync': jax.block_until_ready,
    'hlo': optimized_hlo,
    'model': describe_model(config.model, model),
    'matmul_params': matmul_params,
    'first_call_seconds': first_call,
  }


def row_failed(name: str, err: Exception, failed: dict) -> None:
  """Keeps `err`, the failure of row `name`, whole in `failed[name]` (the
  exception's type and message) and prints its first line and its
  traceback, so that a kernel that fails to compile on a lent GPU can be
  debugged from the log (a compiler's diagnostics follow its first line)."""
  failed[name] = f'{type(err).__name__}: {str(err).strip()}'
  print(f'{name}: failed, {failed[name].splitlines()[0]}', flush=True)
  print(traceback.format_exc(), flush=True)


def lstm_lm_matmul_params(hidden: int, vocab: int, layers: int = 2) -> int:
  """`matmul_params` of the baselines' LM: `layers` LSTM layers of input and
  hidden size `hidden` (two biases each, as cuDNN and PyTorch keep them) and
  an untied softmax."""
  return layers * (8 * hidden * hidden + 8 * hidden) + hidden * vocab + vocab


TORCH_DTYPES = {  # row name -> (parameter dtype, autocast dtype)
  'torch_lstm': ('float32', None),
  'torch_lstm_bf16_autocast': ('float32', 'bfloat16'),
  'torch_lstm_fp16': ('float16', None),
  'torch_lstm_bf16': ('bfloat16', None),
}


# Each baseline's products' dtype (autocast's: bfloat16 operands, float32 weights).
BASELINE_DTYPES = {
  'jax_cudnn_lstm': 'float32',
  'flax_lstm': 'float32',
  **{name: autocast or weights for name, (weights, autocast) in TORCH_DTYPES.items()},
}


def add_ratios(rows: list[dict]) -> None:
  """Each row's ratios to cuDNN from JAX, to the fastest PyTorch row of its
  hidden size, and to the fastest of those whose `dtype` is the row's."""
  for row in rows:
    same = [r for r in rows if r['hidden'] == row['hidden']]
    cudnn = [r for r in same if r['row'].startswith('jax_cudnn_lstm')]
    torch = [r for r in same if r['row'].split('@')[0] in TORCH_DTYPES]
    for key in ('train', 'eval'):
      rate = row[f'{key}_tokens_per_s']
      if cudnn:
        row[f'{key}_vs_cudnn'] = rate / cudnn[0][f'{key}_tokens_per_s']
      if torch:
        fastest = max(torch, key=lambda r: r[f'{key}_tokens_per_s'])
        row[f'{key}_vs_torch_fastest'] = rate / fastest[f'{key}_tokens_per_s']
        row[f'{key}_torch_fastest_row'] = fastest['row']
      of_dtype = [r for r in torch if r['dtype'] == row['dtype']]
      if of_dtype:
        fastest = max(of_dtype, key=lambda r: r[f'{key}_tokens_per_s'])
        row[f'{key}_vs_torch_same_dtype'] = rate / fastest[f'{key}_tokens_per_s']


def torch_lm(name: str, hidden: int, vocab: int, batch: int, bptt: int) -> dict | None:
  """PyTorch's `nn.LSTM` LM of row `name` (`TORCH_DTYPES`): float32; under
  `torch.autocast` to bfloat16 (float32 parameters); or the whole module in
  float16 or bfloat16 (where cuDNN can pick its persistent algorithm: hidden
  a multiple of 128 up to 1024, batch a multiple of 8). cuDNN's fused kernel
  on a GPU (when PyTorch sees one and JAX runs there too), oneDNN's on the
  CPU; the loss in float32 either way. With the calls, `kernels(steps)`:
  the CUDA kernels a train step launches (PyTorch's profiler; None off a GPU)."""
  try:
    import torch
  except ImportError:
    print(f'{name}: skipped, PyTorch is not installed (pip install torch)')
    return None
  param_dtype, autocast = (getattr(torch, d) if d else None for d in TORCH_DTYPES[name])
  device = 'cuda' if jax.default_backend() == 'gpu' and torch.cuda.is_available() else 'cpu'
  torch.manual_seed(0)
  if device == 'cpu':
    torch.set_num_threads(os.cpu_count())
  embed = torch.nn.Embedding(vocab, hidden)
  lstm = torch.nn.LSTM(hidden, hidden, num_layers=2)
  softmax = torch.nn.Linear(hidden, vocab)
  modules = torch.nn.ModuleList([embed, lstm, softmax]).to(device=device, dtype=param_dtype)
  optimizer = torch.optim.SGD(modules.parameters(), lr=1.0)
  inputs, targets = (
    torch.from_numpy(a.T.copy()).long().to(device)  # time-major
    for a in random_batch(vocab, batch, bptt)
  )
  zeros = lambda: torch.zeros(2, batch, hidden, device=device, dtype=param_dtype)
  state = {'carry': (zeros(), zeros())}

  def loss_and_carry():
    with torch.autocast(device, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
      outputs, carry = lstm(embed(inputs), state['carry'])
      logits = softmax(outputs).reshape(-1, vocab).float()
    loss = torch.nn.functional.cross_entropy(logits, targets.reshape(-1))
    return loss, tuple(c.to(param_dtype) for c in carry)

  def train():
    optimizer.zero_grad()
    loss, carry = loss_and_carry()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(modules.parameters(), 5.0)
    optimizer.step()
    state['carry'] = tuple(c.detach() for c in carry)
    return loss

  def evaluate():
    with torch.no_grad():
      return loss_and_carry()[0]

  def kernels(steps: int) -> float | None:
    if device != 'cuda':
      return None
    activity = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[activity]) as profile:
      for _ in range(steps):
        train()
      torch.cuda.synchronize()
    return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in profile.events()) / steps

  sync = (lambda out: torch.cuda.synchronize()) if device == 'cuda' else (lambda out: out)
  try:
    for fn in (train, evaluate):
      sync(fn())
  except RuntimeError as err:  # oneDNN has no float16 LSTM, for one
    print(f'{name}: skipped, PyTorch cannot run it on {device}: {str(err).splitlines()[0]}')
    return None
  return {
    'train': train,
    'eval': evaluate,
    'sync': sync,
    'kernels': kernels,
    'library': f'torch {torch.__version__} ({device}, {TORCH_DTYPES[name][0]}'
    + (f' under autocast to {TORCH_DTYPES[name][1]})' if autocast else ')'),
    'matmul_params': lstm_lm_matmul_params(hidden, vocab),
  }


def _reference_lstm(
  x, h_0, c_0, weights, seq_lengths, input_size, hidden_size, num_layers, dropout, bidirectional
):
  """`jax.experimental.rnn.lstm`'s reference scan on its packed weights."""
  from jax.experimental import rnn

  w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(
    weights, input_size, hidden_size, num_layers, bidirectional
  )
  return rnn.lstm_ref(
    x,
    h_0,
    c_0,
    w_ih,
    w_hh,
    b_ih,
    b_hh,
    seq_lengths,
    input_size,
    hidden_size,
    num_layers,
    dropout,
    bidirectional,
  )


def jax_rnn_lm(
  hidden: int, vocab: int, batch: int, bptt: int, reference: bool = False
) -> dict | None:
  """cuDNN's LSTM from JAX (`jax.experimental.rnn.lstm`, float32), which
  lowers on NVIDIA GPUs only. `reference`: its reference scan instead, on
  any backend (the row's code tested on a CPU; not a speed figure)."""
  from jax.experimental import rnn

  if not reference and jax.default_backend() != 'gpu':
    print('jax_cudnn_lstm: skipped, cuDNN runs on NVIDIA GPUs only (jax.experimental.rnn)')
    return None
  lstm = _reference_lstm if reference else rnn.lstm
  k_embed, k_lstm, k_out = jax.random.split(jax.random.key(0), 3)
  params = {
    'embed': jax.random.uniform(k_embed, (vocab, hidden), minval=-0.1, maxval=0.1),
    'lstm': rnn.init_lstm_weight(k_lstm, hidden, hidden, 2, False),
    'out': jax.random.uniform(k_out, (hidden, vocab), minval=-0.1, maxval=0.1),
    'bias': jnp.zeros(vocab),
  }
  lengths = jnp.full((batch,), bptt, jnp.int32)

  def loss_fn(params, carry, inputs, targets):
    outputs, h, c = lstm(
      params['embed'][inputs],
      *carry,
      params['lstm'],
      lengths,
      input_size=hidden,
      hidden_size=hidden,
      num_layers=2,
      dropout=0.0,
      bidirectional=False,
    )
    logits = outputs @ params['out'] + params['bias']
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(), (h, c)

  optimizer = optax.chain(optax.clip_by_global_norm(5.0), optax.sgd(1.0))

  @jax.jit
  def train_step(params, opt_state, carry, inputs, targets):
    (loss, carry), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, carry, inputs, targets)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, carry, loss

  eval_step = jax.jit(
    lambda params, carry, inputs, targets: loss_fn(params, carry, inputs, targets)[0]
  )
  inputs, targets = random_batch(vocab, batch, bptt)
  zeros = jnp.zeros((2, batch, hidden))
  state = {'params': params, 'opt': optimizer.init(params), 'carry': (zeros, zeros)}

  def train():
    state['params'], state['opt'], state['carry'], loss = train_step(
      state['params'], state['opt'], state['carry'], inputs, targets
    )
    return loss

  def evaluate():
    return eval_step(state['params'], state['carry'], inputs, targets)

  for fn in (train, evaluate):
    jax.block_until_ready(fn())
  return {
    'train': train,
    'eval': evaluate,
    'sync': jax.block_until_ready,
    'library': f'jax {jax.__version__} ({"reference scan" if reference else "cuDNN"})',
    'matmul_params': lstm_lm_matmul_params(hidden, vocab),
  }


def recurrence_matmul_seconds(
  hidden: int, batch: int, bptt: int, layers: int = 2, repeats: int = 5
) -> float:
  """The best time of a window's recurrent products alone: `layers` x `bptt`
  dependent (batch, hidden) x (hidden, 4 hidden) products in a scan, float32,
  forward only. A train step several times this long is bound by something
  else than its recurrent matrix work: per-step kernel launches and the
  elementwise gates on a GPU."""
  w = jax.random.normal(jax.random.key(0), (hidden, 4 * hidden)) / math.sqrt(hidden)

  @jax.jit
  def window(h):
    def step(h, _):
      return jnp.tanh(h @ w)[:, :hidden], None

    for _ in range(layers):
      h, _ = jax.lax.scan(step, h, None, length=bptt)
    return h

  h = jnp.ones((batch, hidden))
  return best_seconds(lambda: window(h), repeats)
