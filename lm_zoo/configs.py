"""The base `ml_collections` config; every experiment file starts from it.

Each field is overridable from the command line:
`lm-zoo-train --config=experiments/ptb_lstm_small.py --config.model.hidden_size=650`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import ml_collections

from lm_zoo.errors import ConfigError


def base_config() -> ml_collections.ConfigDict:
  """Every field the trainer reads, with its default."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  # ptb | wikitext2 | ptb_char | enwik8, or one's own text: text (data_dir holds
  # train.txt, valid.txt and test.txt, a sentence a line) | tfds (a TFDS dataset's text)
  c.data.name = 'ptb'
  # '' -> the programs: $LM_ZOO_DATA; Python: shared/data beside the checkout (tfds:
  # TFDS' own default). The other programs read it back, or take --data_dir.
  c.data.data_dir = ''
  c.data.level = 'word'  # text, tfds: word (split on whitespace) | char
  # text, tfds: the vocabulary's cap (0: none) and the fewest training occurrences
  # of a kept token; the rest read as <unk> (lm_zoo/data/text.py)
  c.data.max_vocab = 0
  c.data.min_count = 1
  c.data.tfds_name = ''  # tfds: the dataset, e.g. lm_zoo_corpus/ptb (lm-zoo-download --tfds_dir)
  c.data.tfds_feature = 'text'  # tfds: its text feature, a sentence an example
  c.data.tfds_splits = ('train', 'valid', 'test')  # tfds: its train, valid and test splits
  c.data.batch_size = 20
  c.data.bptt = 35
  c.data.variable_bptt = False  # AWD-LSTM window lengths, lr scaled by length / bptt
  # > 1: variable windows are padded with unscored steps, which hold the state,
  # to a multiple of this many: the train step compiles once per multiple, not
  # once per drawn length (PTB at bptt 70: 43 lengths in epoch 1, 64 by the
  # fifth; 9 and 10 multiples of 8), for about 5% more steps computed at 8.
  # Short runs gain; a run of more than ~1,000 compiles' time loses. 1: as drawn.
  c.data.pad_windows_to = 1
  c.data.eval_batch_size = 10  # validation during training
  c.data.test_batch_size = 1  # the final test evaluation
  # > 0: keep only the first N tokens of a split (smoke tests, debugging).
  c.data.train_tokens = 0
  c.data.valid_tokens = 0
  c.data.test_tokens = 0

  c.model = ml_collections.ConfigDict()
  c.model.cell = 'lstm'  # a name in lm_zoo.models.CELLS: lstm, mlstm, alstm, flax_lstm, gru, simple
  c.model.num_layers = 2
  c.model.embed_size = 200  # 0: the hidden size
  # >= 0: the embedding size is this times the hidden size (at least 1), also
  # when the hidden size is solved for a budget (the Mogrifier paper's
  # input_embedding_ratio; >= 1: the two sizes are equal, so a tied softmax
  # needs no projection); < 0: model.embed_size decides.
  c.model.embed_ratio = -1.0
  c.model.hidden_size = 200
  c.model.param_budget = 0  # > 0: solve hidden_size for this many parameters
  c.model.output_size = 0  # > 0: the last layer's size (AWD-LSTM: the embedding size)
  c.model.tie_embeddings = False
  # lstm, mlstm and alstm cells; an lstm under init='torch' has none, under 'uniform' it is drawn
  c.model.forget_bias = 1.0
  # lstm, mlstm and alstm cells: c' = f c + min(1 - f, i) j, the input gate capped at
  # one minus the forget gate (lamb's cap_input_gate, set in every published
  # Mogrifier-paper config).
  c.model.cap_input_gate = False
  # lstm cell: a second gate bias on U h, as the Torch code of Zaremba et al. has
  # (main.lua's two nn.Linear); under SGD the gates' bias moves at twice the rate.
  c.model.recurrent_bias = False
  c.model.dropout_embedding = 0.0  # whole words: rows of the embedding matrix
  c.model.dropout_input = 0.0  # on the embedding output, shared over time
  c.model.dropout_hidden = 0.0  # between layers, shared over time
  c.model.dropout_state = 0.0  # on the fed-back h, shared over time
  c.model.dropout_output = 0.0  # on the last layer's output, shared over time
  c.model.weight_drop = 0.0  # DropConnect on the recurrent matrices, per window
  c.model.variational_dropout = True  # False: new masks every step (not the state's)
  # The stack's output is the sum of every layer's output (lamb's lstm_skip_connection);
  # the layers must be of one size (model.output_size 0 or the hidden size).
  c.model.skip_connections = False
  # Where the parameters start (lm_zoo.models.init_schemes): default (each module's
  # own initialisers), uniform (every parameter U(±init_scale), Zaremba's main.lua),
  # torch (AWD-LSTM's, MoS's and the aLSTM's torch code), lamb (the Mogrifier's).
  c.model.init = 'default'
  c.model.init_scale = 0.0  # init = 'uniform' only
  c.model.unroll = 1  # lax.scan unroll
  # How each layer runs a window (lm_zoo.cells.scans; same outputs and gradients):
  # auto (fused where the cell has a kernel, else hoisted where it can, else
  # scan; on every backend), fused (a hand-written
  # backward pass with one weight-gradient product per window: lstm and
  # Mogrifier-lstm layers), pallas (the fused window with Pallas kernels a
  # step: lstm, Mogrifier-lstm and alstm layers), cudnn (cuDNN's LSTM,
  # float32: plain lstm layers without state dropout), hoisted (W x for
  # every step before the scan: lstm), scan (JAX differentiates the step), or
  # remat (each step recomputed in the backward pass: memory for long BPTT).
  c.model.scan = 'auto'
  # Computation dtype: float32, or bfloat16: matrix products on bfloat16
  # operands summed in float32 (GPU/TPU, and CPUs with AVX512-BF16/AMX), with
  # float32 parameters, gates, carries, logits and loss.
  c.model.dtype = 'float32'
  # Mogrifier rounds before every layer's cell (Melis et al. 2020); 0: none.
  c.model.mogrifier = ml_collections.ConfigDict()
  c.model.mogrifier.rounds = 0
  c.model.mogrifier.rank = 0  # k of the low-rank Q^i, R^i; <= 0: full rank
  c.model.mogrifier.zigzag = True  # False: the no-zigzag ablation

  c.model.alstm = ml_collections.ConfigDict()  # cell = 'alstm' only
  # adaptation model: static (eq. 6), lstm (eq. 7) or lstm_rhn (eq. 7 wired
  # across layers as eq. 9)
  c.model.alstm.latent = 'lstm'
  c.model.alstm.latent_size = 100  # size of the latent z the policies are made from
  # Dropout on z after the adaptation model, one mask per window, kept in the
  # latent carry (the authors' --dropouta).
  c.model.alstm.dropout_latent = 0.0
  # W and V orthogonal per gate; False: each one orthogonal matrix over the
  # four gates, as the authors' code draws them (entries up to half as large).
  c.model.alstm.orthogonal_per_gate = True

  # The dual connection between the stack and the softmax (dual paper); size 0: ERS.
  c.model.dual = ml_collections.ConfigDict()
  c.model.dual.size = 0
  c.model.dual.dropout_input = 0.0  # on [e_t; h_t]
  c.model.dual.dropout_output = 0.0  # on d_t
  # What turns the stack's output into next-token probabilities
  # (lm_zoo.models.registry.HEADS): softmax (tied to the embedding with
  # model.tie_embeddings) | mos (a mixture of softmaxes: model.mos).
  c.model.head = 'softmax'
  # head = 'mos' only: the mixture of softmaxes (Yang et al. 2018).
  c.model.mos = ml_collections.ConfigDict()
  c.model.mos.components = 2
  c.model.mos.dropout_latent = 0.0  # on the latents g_k

  # Data parallelism over a device mesh (lm_zoo.training.parallel): batch rows
  # split over this many devices, parameters replicated; 0: all devices.
  c.parallel = ml_collections.ConfigDict()
  c.parallel.num_devices = 1

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = 'sgd'  # sgd | adam | nadam
  c.optimizer.learning_rate = 1.0
  c.optimizer.momentum = 0.0  # sgd
  c.optimizer.beta1 = 0.0  # adam, nadam; 0 is the Mogrifier paper's RMSProp-like choice
  c.optimizer.beta2 = 0.999
  c.optimizer.eps = 1e-8
  c.optimizer.clip_norm = 5.0  # global norm; <= 0 disables
  c.optimizer.l2 = 0.0  # L2 penalty coefficient (added to the gradient)
  # True: the L2 gradient is added before the clipping, as lamb's penalty in the
  # objective is; False: after it, as torch's weight_decay (AWD-LSTM, alstm).
  c.optimizer.l2_before_clip = False
  c.optimizer.dual_l2 = 0.0  # the dual layer's own L2, on top of l2
  c.optimizer.ar = 0.0  # AR: alpha * mean(dropped last-layer output²)
  c.optimizer.tar = 0.0  # TAR: beta * mean((h_t - h_{t-1})²), undropped output
  # mean: NLL per token. sum_over_time: summed over the window, averaged over
  # the batch (Zaremba et al.'s objective, for which lr 1 / clip 5 were tuned).
  c.optimizer.loss_reduction = 'mean'

  # Averaged SGD (lm_zoo.training.averaging): after the trigger, evaluation
  # and checkpoints use the running mean of the parameters.
  c.averaging = ml_collections.ConfigDict()
  # none | always | nonmonotone (NT-ASGD) | plateau | fraction | patience (lamb)
  c.averaging.trigger = 'none'
  c.averaging.nonmono = 5  # nonmonotone: epochs the loss may fail to beat
  c.averaging.start_fraction = 0.5  # fraction: of train.num_epochs
  # patience, checked at every validation turn: updates since the best validation
  # loss, or the update by which averaging starts anyway (0: none).
  c.averaging.patience_steps = 0
  c.averaging.latest_step = 0

  c.schedule = ml_collections.ConfigDict()
  c.schedule.kind = 'constant'  # constant | exponential | milestones | plateau
  c.schedule.factor = 0.5
  c.schedule.decay_after = 4  # exponential: epochs at the base rate
  c.schedule.milestones = (100, 160)  # milestones: epochs after which lr *= factor
  c.schedule.min_lr = 0.0

  c.train = ml_collections.ConfigDict()
  c.train.num_epochs = 1
  c.train.max_steps = 0  # > 0: stop after this many updates in total
  c.train.log_every = 100
  c.train.checkpoint_every = 1000  # steps; the epoch end and the stop also save
  # > 0: also validate every this many steps within an epoch (the best
  # checkpoint, a tuner's pruner and the patience trigger see each turn; the
  # schedule and the other averaging triggers decide on the epoch-end
  # validations only).
  c.train.eval_every = 0
  # > 0: stop training after this many seconds of it in this process (a wall
  # time budget, as a tuning trial's); the best weights are then evaluated.
  c.train.max_seconds = 0.0
  # A work directory whose best weights start this run (AWD-LSTM's fine-tuning
  # stage: with averaging.trigger=always); '' starts from initialisation.
  c.train.init_from = ''
  # Probability that each batch row's carried state is zeroed before a training
  # window (lamb's drop_state_probability; evaluation starts from zero states).
  c.train.drop_state = 0.0
  # On a non-finite training loss or gradient (found on the device, read with
  # the losses at each log line and checkpoint): stop (an error; the latest
  # checkpoint is finite), skip (drop that update: weights, optimizer state and
  # carries stay; counted, logged, in metrics.jsonl) or rollback (restore the
  # latest checkpoint and scale the learning rate by rollback_lr_factor).
  c.train.nonfinite = 'stop'
  c.train.max_consecutive_skips = 10  # skip: stop after this many skipped updates in a row
  c.train.max_rollbacks = 3  # rollback: stop at the next fault after this many rollbacks
  c.train.rollback_lr_factor = 0.5  # rollback: the learning rate is multiplied by it each time

  c.generate = ml_collections.ConfigDict()
  c.generate.num_lines = 3  # text samples printed at the end
  c.generate.num_tokens = 30
  c.generate.temperature = 1.0

  # How the best weights are scored at the end (evaluation_config's fields;
  # valid at data.eval_batch_size and test at data.test_batch_size unless
  # evaluation.batch_size > 0).
  c.evaluation = evaluation_config()
  return c


def evaluation_config(evaluator: str = 'static') -> ml_collections.ConfigDict:
  """How a trained model is scored (`lm-zoo-eval --config=...`, a training
  run's final evaluation, the tuner): `evaluator` names the way, and its
  section of the same name holds that way's settings."""
  c = ml_collections.ConfigDict()
  # static | mc_dropout | temperature | dynamic | learned | token_losses
  c.evaluator = evaluator
  c.splits = ('valid', 'test')
  c.batch_size = 0  # 0: the run's data.test_batch_size (dynamic, learned: 1)
  c.max_tokens = 0  # > 0: score only the first this many tokens of each split

  c.static = ml_collections.ConfigDict()  # dropout off, the state carried through the split
  c.static.temperature = 1.0  # the logits are divided by it

  # Monte-Carlo dropout: the probabilities averaged over dropout masks (the Mogrifier paper: 200)
  c.mc_dropout = ml_collections.ConfigDict()
  c.mc_dropout.samples = 50
  c.mc_dropout.dropout_scale = 1.0  # every dropout rate of the model times this
  c.mc_dropout.seed = 0  # of the masks
  c.mc_dropout.temperature = 1.0

  # The softmax temperature that minimises the loss on valid, by golden-section
  # search in [low, high], then used on every split.
  c.temperature = ml_collections.ConfigDict()
  c.temperature.base = 'static'  # static | mc_dropout: the evaluator whose temperature is tuned
  c.temperature.low = 0.5
  c.temperature.high = 2.0
  c.temperature.tolerance = 0.01

  # Dynamic evaluation (Krause et al. 2018): score each segment, then step on it.
  # With several values in the tuples, every combination is scored on valid and
  # the best one is used on every split.
  c.dynamic = ml_collections.ConfigDict()
  c.dynamic.rule = 'sgd'  # sgd | rms (RMS-normalised steps decaying toward the trained weights)
  c.dynamic.learning_rate = (1e-4,)
  c.dynamic.decay = (0.0,)  # toward the trained weights
  c.dynamic.eps = (1e-3,)  # rms: added to the RMS training gradient
  c.dynamic.segment_length = (5,)  # tokens per update
  # rms: the mean(MS) of the decay rate min(1, decay MS / mean(MS)), over every
  # coordinate (lamb's dyneval.py) or over the parameter tensors (Krause's code)
  c.dynamic.decay_mean = 'coordinates'
  c.dynamic.ms_batches = 100  # rms: training windows of the gradient statistics
  c.dynamic.ms_batch_size = 64  # rms: rows of those windows
  c.dynamic.search_tokens = 0  # > 0: the search scores only the first this many valid tokens
  # How many runs (settings of the search; in a seed study, seeds too) one
  # compiled scan scores at once, vmapped; 0: all. On a GPU at batch 1 more is
  # faster, up to its memory (each run holds its own weights); on a CPU, 1.
  c.dynamic.members = 1

  # The meta-learned update rule (lm-zoo-meta-train), run as dynamic evaluation
  c.learned = ml_collections.ConfigDict()
  c.learned.meta_learner = ''  # '' -> WORKDIR/meta_learner
  return c


def meta_training_config() -> ml_collections.ConfigDict:
  """Meta-training the learned update rule for a trained model
  (`lm-zoo-meta-train`), then scoring with it (`evaluation`)."""
  c = ml_collections.ConfigDict()
  c.meta_steps = 300  # meta-optimizer (Adam) steps
  c.num_updates = 40  # updates of the rule unrolled per meta-step (the paper: >= 40)
  c.segment_length = 5  # tokens per update; evaluation uses the same
  c.batch_size = 4  # stream positions per meta-step
  c.hidden = 16  # hidden units of the coordinate-wise gate network
  # sgd | rms: the rule a fresh meta-learner starts as (SGD pulled toward the
  # trained weights, or RMS dynamic evaluation with MS from theta_0's Fisher)
  c.prior = 'sgd'
  c.initial_learning_rate = 0.03
  # the pull toward the trained weights per update it starts from (sgd: COPY
  # 1 - d, FLUSH d; rms: its lambda)
  c.initial_decay = 0.0067
  c.initial_eps = 1e-3  # rms only
  c.decay_mean = 'coordinates'  # rms: mean(MS) over coordinates (lamb) or tensors (Krause)
  # continue along the training stream from one meta-step to the next instead
  # of restarting from the trained weights at random positions
  c.carry_over = False
  c.meta_learning_rate = 1e-3
  c.fisher_batches = 100  # training windows of theta_0's diagonal Fisher precision
  c.fisher_batch_size = 64
  c.first_order = False  # no second derivatives through the LM gradient
  c.seed = 0  # of the gate network and the stream positions
  c.log_every = 10  # meta-steps between progress lines
  # meta-steps between saves of the progress a stopped run resumes from
  # (FOLDER.progress beside the rule's folder; also saved on SIGTERM / SIGINT)
  c.checkpoint_every = 10
  # the folder the rule is saved to: '' -> WORKDIR/meta_learner; a preset is read
  # as it was exported, so meta-training one names a folder here
  c.output = ''
  # scoring with the rule afterwards; splits=() skips it
  c.evaluation = evaluation_config('learned')
  return c


def field_value(config: ml_collections.ConfigDict, field: str) -> Any:
  """The value of a dotted field ('model.mos.components') of `config`."""
  value = config
  for part in field.split('.'):
    value = value[part]
  return value


def field_error(field: str, value: Any, problem: str) -> ConfigError:
  """The error naming a config field, its value, what is wrong, and its flag."""
  return ConfigError(f'config field {field}={value!r} {problem} (--config.{field})')


def check_choice(field: str, value: Any, names: Iterable[str]) -> None:
  """Raises `field_error` unless `value` is one of `names`, the choices of
  the config field `field`."""
  if value not in names:
    raise field_error(field, value, f'is not known: choose one of {", ".join(names)}')


# (fields, test, what each value must be): a rule of `check_fields`.
Rule = tuple[Iterable[str], Callable[[Any], bool], str]


def check_fields(
  config: ml_collections.ConfigDict,
  choices: Mapping[str, Iterable[str]],
  rules: Iterable[Rule],
  section: str = '',
) -> None:
  """Raises `field_error` for the first field of `config` that names no
  choice of `choices` (field -> the names it may take) or breaks a rule of
  `rules` (a number that fails the test; a NaN fails every test). Fields are
  named within `config`, which is the config's `section` ('model')."""
  prefix = f'{section}.' if section else ''
  for field, names in choices.items():
    check_choice(prefix + field, field_value(config, field), names)
  for fields, test, must_be in rules:
    for field in fields:
      value = field_value(config, field)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not test(value):
        raise field_error(prefix + field, value, f'must be {must_be}')


def unknown_fields(given: Any, known: Any, prefix: str = '') -> list[str]:
  """The dotted names in `given` that `known` lacks (two configs as nested
  dicts, JSON's say): a misspelt or foreign field."""
  if not isinstance(given, dict) or not isinstance(known, dict):
    return []
  unknown = []
  for name, value in given.items():
    if name not in known:
      unknown.append(prefix + name)
    else:
      unknown += unknown_fields(value, known[name], f'{prefix}{name}.')
  return unknown
