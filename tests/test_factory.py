"""Models built from a config: every configuration's parameter tree, initial
values, dropout masks, scans and weight drop as the code before models were
built from parts computed them (tests/data/models_34a235f, written by that
code), its config fields read as then, and the scan switch checked at build."""

import importlib.util
import json
import pathlib

import jax
import numpy as np
import pytest

from lm_zoo.configs import base_config, upgrade_config
from lm_zoo.errors import ConfigError
from lm_zoo.models import (LSTMRHN, Dual, MixtureHead, Softmax, Stack, TiedSoftmax, build_model,
                           init_params)

RECORD = pathlib.Path(__file__).parent / 'data' / 'models_34a235f'
# The recorder's configurations and fingerprints, computed by today's code here.
_spec = importlib.util.spec_from_file_location('models_34a235f_make', RECORD / 'make.py')
recorded = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recorded)

FINGERPRINTS = json.loads((RECORD / 'fingerprints.json').read_text())
# One configuration per mechanism runs in every suite; the rest with -m slow.
EVERY_SUITE = ('lstm_word_dropout_weight_drop', 'mogrifier', 'dual_mos_tied', 'alstm_rhn')


def _build(name):
  """The recorded configuration's model (its fields read through
  `upgrade_config`, as an old config.json is) and initial parameters."""
  fields = upgrade_config({'model': FINGERPRINTS[name]['fields']})['model']
  cfg = recorded.model_config(fields)
  model = build_model(cfg, recorded.VOCAB)
  return cfg, model


@pytest.mark.parametrize('name', FINGERPRINTS)
def test_every_configuration_has_the_parameter_tree_of_34a235f(name):
  _, model = _build(name)
  shapes = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  assert recorded._tree(shapes) == FINGERPRINTS[name]['tree']


def _assert_close(got, want, what):
  assert set(got) == set(want), what
  for key, value in got.items():
    np.testing.assert_allclose(value, want[key], rtol=1e-6, atol=1e-7, err_msg=f'{what} {key}')


@pytest.mark.parametrize('name', [
    name if name in EVERY_SUITE else pytest.param(name, marks=pytest.mark.slow)
    for name in FINGERPRINTS])
def test_every_configuration_computes_what_34a235f_did(name):
  """Initial values, training logits (every dropout mask), evaluation logits,
  gradients (through each scan) and weight drop's masks."""
  cfg, model = _build(name)
  want = FINGERPRINTS[name]
  params = init_params(model, jax.random.key(0), cfg.init_scale)
  _assert_close(recorded._sums(params), want['params'], 'initial')
  got = recorded.fingerprint(model, params, cfg.weight_drop)
  assert got['carries'] == want['carries']
  for key in ('train_loss', 'eval_loss', 'train_logits', 'eval_logits'):
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
  _assert_close(got['grads'], want['grads'], 'gradient')
  if cfg.weight_drop:
    _assert_close(got['dropped'], want['dropped'], 'weight-dropped')


def test_the_factory_assembles_the_parts_the_config_names():
  cfg = recorded.model_config({'tie_embeddings': True, 'dual': {'size': 5},
                               'mos': {'components': 2, 'dropout_latent': 0.1}})
  model = build_model(cfg, 11)
  assert (model.embedding.vocab_size, model.embedding.features, model.vocab_size) == (11, 4, 11)
  assert isinstance(model.stack, Stack) and len(model.stack.cells) == 2
  assert model.stack.dropout_state == 0.1 and model.stack.scan == 'auto'
  assert model.bridge == Dual(5) and model.head == MixtureHead(11, 2, 0.1, tied=True)
  assert build_model(recorded.model_config({}), 11).head == Softmax(11)
  assert build_model(recorded.model_config({'tie_embeddings': True}), 11).head == TiedSoftmax(11)
  rhn = recorded.model_config({'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn'}})
  assert isinstance(build_model(rhn, 11).stack, LSTMRHN)
  # The capped gate reaches the cell inside the Mogrifier's wrapper, and the
  # skip connections the stack, for every cell of the LSTM family.
  for cell in ('lstm', 'mlstm'):
    lamb = recorded.model_config({'cell': cell, 'cap_input_gate': True, 'skip_connections': True,
                                  'hidden_size': 4, 'mogrifier': {'rounds': 3, 'rank': 2}})
    model = build_model(lamb, 11)
    assert model.stack.skip_connections
    for mogrify in model.stack.cells:
      assert mogrify.rounds == 3 and mogrify.cell.cap_input_gate, (cell, mogrify)


def test_a_scan_the_cells_cannot_take_is_refused_at_build():
  cfg = base_config().model
  cfg.update(cell='gru', scan='fused')
  with pytest.raises(ConfigError, match=r"model.scan='fused' cannot run GRUCell: choose one "
                                        r"of 'auto', 'scan', 'remat' \(--config.model.scan\)"):
    build_model(cfg, 10)
  cfg.update(cell='alstm', scan='hoisted')
  cfg.alstm.latent = 'lstm_rhn'
  with pytest.raises(ConfigError, match="model.scan='hoisted' cannot run LSTMRHNStack"):
    build_model(cfg, 10)
  cfg.scan = 'fastest'
  with pytest.raises(ConfigError, match="model.scan='fastest' is not known"):
    build_model(cfg, 10)
