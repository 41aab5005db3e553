"""`LSTMRHNStack`'s fused window: the stack's settings, parameters and
dropout masks handed to `lstm_rhn_recurrence`.

The stack draws its variational masks (between layers, on each fed-back h,
and each layer's latent) with `nn.Dropout` inside its step; under the plain
scan every step draws the same ones. The window draws them once before the
scan by calling the stack's step with every `nn.Dropout` intercepted: the
mask is the module's output for an input of ones, drawn from the module's own
RNG stream, so both ways run the same masks under the same 'dropout' RNG.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_zoo.cells.alstm import ALSTMCell, LSTMRHNStack
from lm_zoo.cells.base import describe
from lm_zoo.cells.lstm import LSTMCell
from lm_zoo.cells.lstm_rhn_recurrence import LayerMasks, lstm_rhn_recurrence

# `RecurrentLayer`'s plain scan (`nn.scan`, which checks that the parameters
# are loop invariants) traces the step twice, once before the loop; each trace
# draws once from every `nn.Dropout`'s RNG stream, so the loop runs the second
# draws.
DRAWS_BEFORE_THE_LOOP = 1
# A layer's state_mask multiplies its cell's carried output, which the stack's
# carry (its layers' carries) is not; every way refuses it.
STATE_MASK_REFUSAL = (
  'the LSTM-RHN stack masks its fed-back states itself '
  '(LSTMRHNStack.dropout_state): run its layer with no state_mask'
)


def lstm_rhn_refusal(stack: LSTMRHNStack) -> str | None:
  """Why the fused window cannot run `stack`, or None."""
  for layer, cell in enumerate(stack.cells):
    if type(cell) is not ALSTMCell:
      return (
        f'the fused LSTM-RHN window steps ALSTMCell layers only, and layer {layer} is '
        f"{describe(cell)}: run scan='scan'"
      )
    if cell.latent is not LSTMCell:
      name = getattr(cell.latent, '__name__', type(cell.latent).__name__)
      return (
        f'the fused LSTM-RHN window runs LSTMCell adaptation models only, and layer '
        f"{layer} has {name}: run scan='scan'"
      )
  return None


def _drops(stack: LSTMRHNStack) -> bool:
  """Whether the stack's step would draw any dropout mask."""
  between = not stack.deterministic and (stack.dropout_hidden > 0 or stack.dropout_state > 0)
  return between or any(cell.dropout_latent > 0 and cell.has_rng('dropout') for cell in stack.cells)


def _drawn_masks(stack: LSTMRHNStack, carry, x: jax.Array) -> tuple[LayerMasks, ...]:
  """Each layer's masks, as one call of the stack's step draws them: its
  `nn.Dropout`s run in the order state (layer 1), then hidden and state of
  each layer above, each layer's latent dropout after its state's."""
  stack_masks, latent_masks = [], {}

  def draw(next_fun, args, kwargs, context):
    module = context.module
    if not isinstance(module, nn.Dropout) or context.method_name != '__call__':
      return next_fun(*args, **kwargs)
    value = args[0]
    mask = None
    if module.rate > 0 and not module.deterministic:
      mask = next_fun(jnp.ones_like(value), *args[1:], **kwargs)
    if isinstance(module.parent, LSTMRHNStack):
      stack_masks.append(mask)
    else:  # a layer's latent dropout, after that layer's state dropout
      latent_masks[(len(stack_masks) - 1) // 2] = mask
    return value if mask is None else value * mask

  with nn.intercept_methods(draw):
    stack(carry, x)
  hidden = [None, *stack_masks[1::2]]
  return tuple(
    LayerMasks(hidden[layer], stack_masks[2 * layer], latent_masks.get(layer))
    for layer in range(len(stack.cells))
  )


def variational_masks(stack: LSTMRHNStack, carry, x: jax.Array) -> tuple[LayerMasks, ...] | None:
  """The masks the plain scan of `stack` runs at every step of a window whose
  first input is `x` (None where it drops nothing)."""
  if not _drops(stack):
    return None
  for _ in range(DRAWS_BEFORE_THE_LOOP):
    _drawn_masks(stack, carry, x)
  return _drawn_masks(stack, carry, x)


def lstm_rhn_window(
  stack: LSTMRHNStack,
  params,
  carry,
  inputs: jax.Array,
  state_mask: jax.Array | None = None,
  unroll: int = 1,
  steps: jax.Array | None = None,
):
  """`LSTMRHNStack`'s window: `lstm_rhn_recurrence` of its layers' parameters
  (their cells', as `params` holds none where the cells live beside the
  stack) under the masks its step draws."""
  del params
  if state_mask is not None:
    raise ValueError(STATE_MASK_REFUSAL)
  cells = stack.cells
  layer_params = tuple(cell.variables['params'] for cell in cells)
  masks = variational_masks(stack, carry, inputs[0])
  dtypes = tuple(
    cell.dtype or jnp.result_type(inputs, p['input']['kernel_1'])
    for cell, p in zip(cells, layer_params)
  )
  return lstm_rhn_recurrence(
    inputs,
    layer_params,
    carry,
    masks,
    dtypes,
    unroll,
    tuple(cell.cap_input_gate for cell in cells),
    steps,
  )


def lstm_rhn_kernel(stack: LSTMRHNStack):
  """The stack's fused kernel, or why it has none (`scans.KernelFactory`)."""
  return lstm_rhn_refusal(stack) or lstm_rhn_window
