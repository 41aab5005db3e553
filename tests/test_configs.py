"""Every experiments/ config loads, builds, and the paper recipes hold their numbers."""

import importlib.util

import jax
import pytest

from conftest import REPO
from lm_zoo.models import build_model, init_params

CONFIGS = sorted((REPO / 'experiments').glob('*.py'))


def load(path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def lstm_lm_params(vocab, embed, hidden, layers):
  """Embedding + per layer 4n(m + n) + 4n + untied softmax n V + V."""
  sizes = [embed] + [hidden] * (layers - 1)
  recurrent = sum(4 * hidden * (m + hidden) + 4 * hidden for m in sizes)
  return vocab * embed + recurrent + hidden * vocab + vocab


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.stem)
def test_config_builds_a_model(path):
  config = load(path)
  model = build_model(config.model, 10_000)
  shapes = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  count = sum(x.size for x in jax.tree.leaves(shapes))
  m = config.model
  assert count == lstm_lm_params(10_000, m.embed_size, m.hidden_size, m.num_layers)


def test_zaremba_recipes():
  small = load(REPO / 'experiments' / 'ptb_lstm_small.py')
  assert (small.model.hidden_size, small.train.num_epochs, small.data.bptt,
          small.data.batch_size, small.optimizer.clip_norm,
          small.model.init_scale) == (200, 13, 20, 20, 5.0, 0.1)
  medium = load(REPO / 'experiments' / 'ptb_lstm_medium.py')
  assert (medium.model.hidden_size, medium.train.num_epochs,
          medium.model.dropout_hidden) == (650, 39, 0.5)
