"""What the zoo asks of any cell beyond flax's protocol: naming a cell and
scaling the dropout rates cells and model parts declare."""

import flax.linen as nn
import pytest

from lm_zoo.cells import ALSTMCell, LSTMCell, Mogrify, dropout_scaled
from lm_zoo.cells.base import describe
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack


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
  model = RecurrentLM(Embedding(5, 3, dropout_words=0.1, dropout=0.2),
                      Stack([cell, plain], dropout_state=0.3, weight_drop=0.25), Softmax(5))
  scaled = dropout_scaled(model, 2.0)
  assert (scaled.embedding.dropout_words, scaled.embedding.dropout) == pytest.approx((0.2, 0.4))
  assert (scaled.stack.dropout_state, scaled.stack.weight_drop,
          scaled.stack.dropout_hidden) == pytest.approx((0.6, 0.5, 0.0))
  assert scaled.stack.cells[0].cell.dropout_latent == pytest.approx(0.4)
  assert scaled.stack.cells[1] is plain and scaled.head is model.head
  with pytest.raises(ValueError, match=r"leaves rates outside \[0, 1\): "
                                       r"\{'Stack.dropout_state': 1.2, 'Stack.weight_drop': 1.0"):
    dropout_scaled(model, 4.0)
