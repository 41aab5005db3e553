"""Every experiments/ config loads, builds, and the paper recipes hold their
numbers (Zaremba et al.'s in test_zaremba_recipes.py)."""

import pytest
from conftest import REPO, load_experiment

from lm_zoo.models import build_model, count_params, solve_hidden_size
from lm_zoo.training import epoch_learning_rate

# Language-model configs; task configs (a `task` field) are tested in
# test_adaptive_ff.py and test_reverse_copy.py, tuning and evaluation configs
# below, and from_workdir.py (a run's own config) in test_tuning_study.py;
# recipes.py holds the builders the others share.
TUNING = sorted(p.stem for p in (REPO / 'experiments').glob('tune_*.py'))
# (__init__.py makes the folder a package that installs with lm_zoo.)
EVALUATION = ['dyneval_learned', 'dyneval_rms', 'dyneval_sgd', 'evaluate']
CONFIGS = sorted(
  p.stem
  for p in (REPO / 'experiments').glob('[!_]*.py')
  if 'c.task = ' not in p.read_text()
  and p.stem not in [*TUNING, *EVALUATION, 'from_workdir', 'recipes']
)


def lstm_lm_params(vocab, embed, hidden, layers, biases=1):
  """Embedding + per layer 4n(m + n) + 4n per gate bias + untied softmax n V + V."""
  sizes = [embed] + [hidden] * (layers - 1)
  recurrent = sum(4 * hidden * (m + hidden) + biases * 4 * hidden for m in sizes)
  return vocab * embed + recurrent + hidden * vocab + vocab


@pytest.mark.parametrize('name', CONFIGS)
def test_config_builds_a_model(name):
  config = load_experiment(name)
  count = count_params(build_model(config.model, 10_000))
  m = config.model
  if m.param_budget:
    assert 0.97 * m.param_budget < count <= m.param_budget
  elif m.cell == 'alstm':  # the paper's size: tested below
    assert m.output_size == m.embed_size
  elif m.dual.size:  # counted in test_dual_variants_are_their_ers_models_plus_the_dual_layer
    assert m.tie_embeddings
  else:
    assert count == lstm_lm_params(
      10_000, m.embed_size, m.hidden_size, m.num_layers, 2 if m.recurrent_bias else 1
    )


@pytest.mark.parametrize(
  'name, variant',
  [
    ('evaluate', 'static'),
    ('evaluate', 'mc_dropout'),
    ('evaluate', 'temperature'),
    ('evaluate', 'token_losses'),
    ('evaluate', 'learned'),
    ('dyneval_sgd', None),
    ('dyneval_rms', 'lamb'),
    ('dyneval_rms', 'krause'),
    ('dyneval_learned', 'sgd'),
    ('dyneval_learned', 'rms'),
  ],
)
def test_evaluation_configs_build_their_evaluators(name, variant):
  from lm_zoo.evaluation import MetaLearner, build_evaluator

  config = load_experiment(name, *[variant] * bool(variant))
  evaluation = config.evaluation if 'evaluation' in config else config
  learned = MetaLearner(None, None, 5, 0.1) if evaluation.evaluator == 'learned' else None
  evaluator = build_evaluator(evaluation, bptt=35, batch_size=1, meta_learner=learned)
  assert (
    type(evaluator).__name__
    == {
      'static': 'Static',
      'mc_dropout': 'MCDropout',
      'temperature': 'TunedTemperature',
      'token_losses': 'TokenLosses',
      'dynamic': 'Dynamic',
      'learned': 'Learned',
    }[evaluation.evaluator]
  )
  if name == 'dyneval_rms':
    assert evaluator.decay_mean == {'lamb': 'coordinates', 'krause': 'tensors'}[variant]


# The LSTM variants' spaces are the Mogrifier's without rounds and rank; Enwik8's
# (Table 5) is Table 4's with narrower dropouts on a 96M model, slow to solve for.
@pytest.mark.parametrize(
  'name, variant',
  [
    ('tune_ptb_small', 'mogrifier'),
    ('tune_mogrifier', 'mogrifier'),
    ('tune_dyneval', 'word'),
    ('tune_dyneval', 'char'),
  ],
)
def test_tuning_configs_are_valid_and_their_extremes_fit_the_budget(name, variant):
  from lm_zoo.training.config_checks import validate_config
  from lm_zoo.tuning import set_fields
  from lm_zoo.tuning.study import validate_tuning

  tune = load_experiment(name, variant)
  tune.dyneval.workdir = tune.dyneval.workdir or 'runs/x'
  validate_tuning(tune)
  if tune.kind == 'dyneval':
    return
  # Every corner's training config is valid and sized to the base's budget.
  for corner in ('low', 'high'):
    values = {n: spec[corner] for n, spec in tune.space.items()}
    config = set_fields(tune.base, tune.space, values)
    validate_config(config)
    vocab = 205 if config.data.name == 'enwik8' else 10_000
    count = count_params(build_model(config.model, vocab))
    assert 0.95 * config.model.param_budget < count <= config.model.param_budget


# Vocabulary sizes of our corpora (enwik8: its 205 byte values).
VOCAB = {'ptb': 10_000, 'wikitext2': 33_278, 'ptb_char': 50, 'enwik8': 205}
LAMB_VARIANTS = [
  'ptb_lstm',
  'ptb_mogrifier',
  'wikitext2_lstm',
  'wikitext2_mogrifier',
  'ptb_char_mogrifier',
  'enwik8_48m_lstm',
  'enwik8_48m_mogrifier',
  'enwik8_96m_lstm',
  'enwik8_96m_mogrifier',
]


def lamb_params(fields, vocab, hidden):
  """Trainable variables of lamb's LM (lm.py, tiled_lstm.py, utils.py) at a
  hidden size: the embedding; per layer W [x; h] -> 4 gates and their biases,
  and per Mogrifier round a low-rank (or full) map with a bias onto the x
  (odd rounds) or h (even rounds) it gates; the softmax (its weights tied or
  not, and its bias), or the mixture's projection to K latents (with a bias)
  and its mixture weights (without)."""
  embed = max(1, round(min(fields['input_embedding_ratio'], 1.0) * hidden))
  rounds, rank = fields['feature_mask_rounds'], fields['feature_mask_rank']
  total = vocab * embed
  for layer in range(fields['num_layers']):
    m = embed if layer == 0 else hidden
    total += 4 * hidden * (m + hidden) + 4 * hidden
    for i in range(1, rounds + 1):
      source, target = (hidden, m) if i % 2 else (m, hidden)
      total += (rank * (source + target) if rank else source * target) + target
  components = fields['mos_num_components']
  if components:
    total += hidden * components * embed + components * embed + hidden * components
  elif embed != hidden:
    total += hidden * embed  # the projection to the output embedding
  if not fields['share_input_and_output_embeddings']:
    total += embed * vocab
  return total + vocab


@pytest.mark.parametrize('variant', LAMB_VARIANTS)
def test_mogrifier_paper_configs_build_lambs_model_at_its_budget(variant):
  from runpy import run_path

  fields = run_path(str(REPO / 'experiments' / 'mogrifier_paper.py'))['VARIANTS'][variant]
  config = load_experiment('mogrifier_paper', variant)
  vocab, budget = VOCAB[config.data.name], fields['num_params']
  # lamb's budgeting: the largest hidden size within num_params.
  hidden = max(h for h in range(1, 4000) if lamb_params(fields, vocab, h) <= budget)
  assert lamb_params(fields, vocab, hidden + 1) > budget
  model_config = config.model.copy_and_resolve_references()
  model_config.update(param_budget=0, hidden_size=hidden)
  count = count_params(build_model(model_config, vocab))
  assert count == lamb_params(fields, vocab, hidden)
  assert budget * 0.99 < count <= budget  # the published size: 24M, 35M, 48M, 96M
  assert config.model.param_budget == budget
  c = config
  assert (
    c.model.cap_input_gate,
    c.model.skip_connections,
    c.train.drop_state,
    c.model.variational_dropout,
  ) == (True, True, 0.01, False)
  assert (
    c.optimizer.clip_norm,
    c.optimizer.loss_reduction,
    c.optimizer.l2_before_clip,
    c.optimizer.beta1,
  ) == (10.0, 'sum_over_time', True, 0.0)
  assert c.train.max_steps == fields['turns'] * fields['steps_per_turn']
  assert c.averaging.latest_step == (
    fields['trigger_averaging_at_the_latest'] * fields['steps_per_turn']
  )
  assert (
    c.model.dropout_input,
    c.model.dropout_hidden,
    c.model.dropout_state,
    c.model.dropout_output,
  ) == tuple(
    fields[k] for k in ('input_dropout', 'inter_layer_dropout', 'state_dropout', 'output_dropout')
  )


@pytest.mark.parametrize(
  'variant, folder',
  [('ptb_lstm', 'ptb'), ('ptb_char_mogrifier', 'ptb-char'), ('wikitext2_lstm', 'wikitext-2')],
)
def test_mogrifier_paper_evaluates_at_lambs_batch_of_100_lines_a_row(variant, folder, data_dir):
  """lamb evaluates at min(batch, lines // 100) (`evaluation.py`), counting
  each split's lines: the configs' batches, from our copies of the files."""
  config = load_experiment('mogrifier_paper', variant)
  for split, field in (('valid', 'eval_batch_size'), ('test', 'test_batch_size')):
    with open(data_dir / folder / f'{split}.txt', encoding='utf-8') as f:
      lines = sum(1 for _ in f)
    assert config.data[field] == max(1, min(config.data.batch_size, lines // 100)) < 64


def test_lamb_budget_solving_finds_lambs_hidden_size():
  from runpy import run_path

  for variant in ('ptb_mogrifier', 'wikitext2_mogrifier'):
    fields = run_path(str(REPO / 'experiments' / 'mogrifier_paper.py'))['VARIANTS'][variant]
    config = load_experiment('mogrifier_paper', variant)
    vocab = VOCAB[config.data.name]
    hidden = solve_hidden_size(config.model, vocab, config.model.param_budget)
    assert lamb_params(fields, vocab, hidden) <= fields['num_params']
    assert lamb_params(fields, vocab, hidden + 1) > fields['num_params']


def test_ablation_variants_share_the_budget():
  variants = [
    ('ptb_mogrifier_ablation', v) for v in ('lstm', 'r1', 'nozigzag', 'fullrank', 'mlstm')
  ]
  for name, variant in variants + [('ptb_alstm_small', 'static'), ('ptb_alstm_small', 'lstm_rhn')]:
    config = load_experiment(name, variant)
    count = count_params(build_model(config.model, 10_000))
    assert 0.97 * 3_000_000 < count <= 3_000_000, variant


@pytest.mark.parametrize('variant', ['models', 'mos', 'lamb_features'])
def test_seed_study_models_share_the_budget(variant):
  study = load_experiment('seed_study', variant)
  for name, config in study.models.items():
    count = count_params(build_model(config.model, 10_000))
    if config.model.dual.size:  # the ERS model's hidden size, plus the dual layer
      assert 3_000_000 < count < 3_100_000, name
    else:
      assert 0.97 * 3_000_000 < count <= 3_000_000, name


def test_seed_study_mixture_is_yangs_head_on_the_budget_lstm():
  config = load_experiment('seed_study', 'mos').models.lstm_mos
  assert (config.model.head, config.model.mos.components, config.model.mos.dropout_latent) == (
    'mos',
    2,
    0.4,
  )
  h, k, v = solve_hidden_size(config.model, 10_000, 3_000_000), 2, 10_000
  # Tied embedding, two LSTM layers of h, then Yang et al.'s head: a prior
  # without bias (h -> K), the latents (h -> K h, biased), the softmax's bias.
  count = lambda h: v * h + 2 * (4 * h * 2 * h + 4 * h) + h * k + (h * k * h + k * h) + v
  assert count_params(build_model(config.model, v)) == count(h)
  assert count(h) <= 3_000_000 < count(h + 1)  # the largest on the budget


def _authors_alstm_count(vocab, embed, hidden, latent=100):
  """Parameters of flennerhag/alstm's 2-layer `aLSTM` LM (examples/model.py,
  alstm/alstm.py), less the second bias of each torch LSTMCell (our latent
  LSTMs have one): per layer an adaptation LSTM of [x; h; z below] (LSTM-RHN),
  a policy projection of m + 13 n outputs without bias, W, V and b; the tied
  embedding and the decoder's bias."""
  total = vocab * embed + vocab
  for m, n in ((embed, hidden), (hidden, embed)):
    total += 4 * latent * (latent + m + n + latent) + 4 * latent  # the adaptation LSTM
    total += latent * (m + 13 * n) + 4 * n * (m + n) + 4 * n
  return total


@pytest.mark.parametrize(
  'corpus, vocab, published', [('ptb', 10_000, 17_000_000), ('wikitext2', 33_278, 32_000_000)]
)
def test_alstm_recipe_is_the_authors(corpus, vocab, published):
  config = load_experiment('alstm_paper', corpus)
  count = count_params(build_model(config.model, vocab))
  hidden = config.model.hidden_size
  # The authors' code builds 17,197,800 (PTB) and 32,133,678 (WT2) parameters,
  # 800 of them the duplicate LSTMCell biases; the paper rounds to 17M and 32M.
  # Against the rounded 17M their own model is 1.16% over, so the bound here
  # is the rounding's, not 1%: the exact check is the line above.
  assert count == _authors_alstm_count(vocab, 400, hidden)
  assert abs(count + 800 - published) < 0.015 * published
  assert config.model.alstm.latent == 'lstm_rhn' and config.model.alstm.dropout_latent == 0.1
  assert not config.model.alstm.orthogonal_per_gate  # torch's orthogonal_ on the whole (4n, .)
  assert (
    config.model.dropout_embedding,
    config.model.dropout_input,
    config.model.dropout_hidden,
    config.model.dropout_output,
  ) == (0.16, 0.6, 0.25, 0.6)
  assert (config.optimizer.clip_norm, config.optimizer.eps) == (5.0, 1e-9)
  lr = lambda epoch: epoch_learning_rate(config.schedule, 3e-3, epoch, [])
  first_cut = config.schedule.milestones[0]
  assert lr(first_cut) == 3e-3 and abs(lr(first_cut + 1) - 3e-4) < 1e-12
  assert config.data.variable_bptt and config.data.batch_size == 20


def test_awd_lstm_recipe():
  config = load_experiment('awd_lstm', 'ptb')
  m = config.model
  # Tied: embedding, three LSTMs 400 -> 1150 -> 1150 -> 400 with torch's two
  # gate biases each (bias_ih, bias_hh), softmax bias only.
  sizes = [(400, 1150), (1150, 1150), (1150, 400)]
  expected = 10_000 * 400 + sum(4 * n * (i + n) + 8 * n for i, n in sizes) + 10_000
  assert count_params(build_model(m, 10_000)) == expected
  assert abs(expected - 24_000_000) < 0.01 * 24_000_000  # the paper: 24M
  assert (
    m.dropout_output,
    m.dropout_hidden,
    m.dropout_input,
    m.dropout_embedding,
    m.weight_drop,
  ) == (0.4, 0.25, 0.4, 0.1, 0.5)
  assert (config.optimizer.ar, config.optimizer.tar, config.averaging.trigger) == (
    2.0,
    1.0,
    'nonmonotone',
  )
  small = load_experiment('awd_lstm', 'small')
  plain = load_experiment('ptb_mogrifier_ablation', 'lstm')
  assert small.model.param_budget == plain.model.param_budget


@pytest.mark.parametrize('variant, ers', [('lstm_dual', 'lstm'), ('mogrifier_dual', 'r2')])
def test_dual_variants_are_their_ers_models_plus_the_dual_layer(variant, ers):
  dual = load_experiment('dual', variant)
  plain = load_experiment('ptb_mogrifier_ablation', ers)
  hidden = solve_hidden_size(plain.model, 10_000, plain.model.param_budget)
  assert dual.model.hidden_size == dual.model.dual.size == hidden
  for config in (dual, plain):
    config.model.update(param_budget=0, hidden_size=hidden)
  dual_size = dual.model.dual.size
  extra = (2 * hidden) * dual_size + dual_size  # W_d on [e; h] (embedding = hidden), b_d
  assert (
    count_params(build_model(dual.model, 10_000))
    == count_params(build_model(plain.model, 10_000)) + extra
  )
  dual.model.dual.update(size=0, dropout_input=0.0, dropout_output=0.0)
  assert dual.to_dict() == plain.to_dict()


def test_dual_paper_recipe():
  config = load_experiment('dual', 'paper')
  count = count_params(build_model(config.model, 10_000))
  assert abs(count - 23_000_000) < 0.01 * 23_000_000  # the paper: 23M
  assert (config.model.mogrifier.rounds, config.model.mogrifier.rank) == (4, 100)
  assert config.optimizer.name == 'nadam' and config.data.bptt == 25


@pytest.mark.parametrize('variant', ['zaremba_medium_dyneval', 'mogrifier_24m'])
def test_paper_seed_studies_train_the_recipes_they_name(variant):
  """Each model is its recipe with only the study's changes; the dynamic
  evaluations are dyneval_rms.py:krause and dyneval_sgd.py searched on valid,
  every run at once."""
  from lm_zoo.tasks.study_evaluations import study_evaluations

  study = load_experiment('paper_seed_studies', variant)
  assert study.task == 'seeds' and study.stack and study.reference in study.models
  if variant == 'zaremba_medium_dyneval':
    recipes = {'lstm_medium': load_experiment('ptb_lstm_medium')}
    recipes['lstm_medium'].model.dtype = 'bfloat16'
    for name, rule in (
      ('rms', load_experiment('dyneval_rms', 'krause')),
      ('sgd', load_experiment('dyneval_sgd')),
    ):
      rule.dynamic.update(search_tokens=10_000, members=0)  # all runs in one scan
      assert study.evaluations[name].to_dict() == rule.to_dict()
  else:
    recipes = {
      'lstm': load_experiment('mogrifier_paper', 'ptb_lstm'),
      'mogrifier': load_experiment('mogrifier_paper', 'ptb_mogrifier'),
    }
    for recipe in recipes.values():
      recipe.train.max_seconds = 240  # the same training time for both
  for recipe in recipes.values():
    recipe.generate.num_lines = 0
  assert {name: config.to_dict() for name, config in study.models.items()} == {
    name: recipe.to_dict() for name, recipe in recipes.items()
  }
  assert list(study_evaluations(study)) == list(study.get('evaluations') or {})
