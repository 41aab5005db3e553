"""What the zoo asks of any cell beyond flax's protocol: naming a cell and
scaling the dropout rates cells and model parts declare."""

import flax.linen as nn
import pytest

from lm_zoo.cells import ALSTMCell, LSTMCell, Mogrify, dropout_scaled
from lm_zoo.cells.base import describe
from lm_zoo.models import LSTMRHN, Dual, Embedding, MixtureHead, RecurrentLM, Softmax, Stack


def test_describe_names_a_cell_and_the_cells_it_wraps():
  assert describe(nn.GRUCell(3)) == 'GRUCell'
  assert describe(Mogrify(Mogrify(LSTMCell(3)), rounds=2)) == 'Mogrify(Mogrify(LSTMCell))'


def test_dropout_scaled_scales_declared_rates_of_wrapped_cells_and_parts():
  cell = Mogrify(ALSTMCell(4, latent_size=2, dropout_latent=0.2), rounds=2)
  scaled = dropout_scaled(cell, 2.0)
  assert scaled.cell.dropout_latent == pytest.approx(0.4) and scaled.rounds == 2
  assert cell.cell.dropout_latent == 0.2  # a copy
  plain = LSTMCell(4)
  assert dropout_scaled(plain, 2.0) is plain  # it declares no rate
  model = RecurrentLM(
    Embedding(5, 3, dropout_words=0.1, dropout=0.2),
    Stack([cell, plain], dropout_state=0.3, weight_drop=0.25),
    Softmax(5),
  )
  scaled = dropout_scaled(model, 2.0)
  assert (scaled.embedding.dropout_words, scaled.embedding.dropout) == pytest.approx((0.2, 0.4))
  assert (
    scaled.stack.dropout_state,
    scaled.stack.weight_drop,
    scaled.stack.dropout_hidden,
  ) == pytest.approx((0.6, 0.5, 0.0))
  assert scaled.stack.cells[0].cell.dropout_latent == pytest.approx(0.4)
  assert scaled.stack.cells[1] is plain and scaled.head is model.head
  with pytest.raises(
    ValueError,
    match=r'leaves rates outside \[0, 1\): '
    r"\{'Stack.dropout_state': 1.2, 'Stack.weight_drop': 1.0",
  ):
    dropout_scaled(model, 4.0)


def test_dropout_scaled_reaches_the_bridge_the_head_and_the_lstm_rhn():
  cells = [ALSTMCell(4, latent_size=2, dropout_latent=0.1) for _ in range(2)]
  model = RecurrentLM(
    Embedding(5, 3),
    LSTMRHN(cells, dropout_hidden=0.1, dropout_output=0.2),
    MixtureHead(5, 2, dropout_latent=0.3),
    Dual(4, 0.1, 0.2),
  )
  scaled = dropout_scaled(model, 2.0)
  assert (scaled.stack.dropout_hidden, scaled.stack.dropout_output) == pytest.approx((0.2, 0.4))
  assert [c.dropout_latent for c in scaled.stack.cells] == pytest.approx([0.2, 0.2])
  assert (scaled.bridge.dropout_input, scaled.bridge.dropout_output) == pytest.approx((0.2, 0.4))
  assert scaled.head.dropout_latent == pytest.approx(0.6)
  assert (model.bridge.dropout_input, model.head.dropout_latent) == (0.1, 0.3)  # copies
