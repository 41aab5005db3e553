"""Records, with the code of 34a235f (before `RecurrentLM` was built from
parts and the scan switch replaced model.fused_recurrence / model.remat), what
each model configuration of `CONFIGS` gives: its parameter tree (paths,
shapes, dtypes), its initial parameters, its logits and loss in training
(dropout masks included) and at evaluation, its gradients, and its weights
after weight drop. tests/test_factory.py builds the same configurations with
today's code and compares.

Run from the repository root: python tests/data/models_34a235f/make.py
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lm_zoo.configs import base_config
from lm_zoo.models import build_model, init_params

VOCAB, BATCH, STEPS = 11, 3, 5
DROPOUT = {'dropout_input': 0.2, 'dropout_hidden': 0.2, 'dropout_state': 0.1,
           'dropout_output': 0.2}
ALSTM = {'cell': 'alstm', 'alstm': {'latent': 'lstm', 'latent_size': 3, 'dropout_latent': 0.2}}
# name -> model config fields over base_config's, embed 4, hidden 6 and DROPOUT
CONFIGS = {
    'lstm': {},
    'lstm_word_dropout_weight_drop': {'dropout_embedding': 0.3, 'weight_drop': 0.3},
    'lstm_per_step_dropout': {'variational_dropout': False, 'dropout_embedding': 0.3},
    'lstm_unfused': {'fused_recurrence': False, 'weight_drop': 0.3},
    'lstm_remat': {'remat': True},
    'lstm_unroll_cap': {'unroll': 2, 'cap_input_gate': True, 'forget_bias': 0.5},
    'lstm_skip': {'skip_connections': True, 'num_layers': 3},
    'lstm_output_size': {'output_size': 4, 'tie_embeddings': True},
    'lstm_init_scale': {'init_scale': 0.1},
    'tied_projection': {'tie_embeddings': True},
    'tied_same_size': {'tie_embeddings': True, 'embed_size': 6},
    'mogrifier': {'mogrifier': {'rounds': 3, 'rank': 2}, 'weight_drop': 0.3},
    'mogrifier_unfused': {'mogrifier': {'rounds': 3, 'rank': 2}, 'fused_recurrence': False},
    'mogrifier_remat': {'mogrifier': {'rounds': 2}, 'remat': True},
    'mogrifier_no_zigzag_cap': {'mogrifier': {'rounds': 4, 'rank': 0, 'zigzag': False},
                                'cap_input_gate': True},
    'mogrifier_zero_rounds': {'mogrifier': {'rounds': 0}},
    'mogrifier_gru': {'cell': 'gru', 'mogrifier': {'rounds': 2}},
    'mogrifier_alstm': {**ALSTM, 'mogrifier': {'rounds': 2, 'rank': 2}},
    'dual': {'dual': {'size': 5, 'dropout_input': 0.2, 'dropout_output': 0.3}},
    'mos': {'mos': {'components': 2, 'dropout_latent': 0.2}},
    'mos_tied': {'tie_embeddings': True, 'mos': {'components': 3, 'dropout_latent': 0.2}},
    'dual_mos_tied': {'tie_embeddings': True, 'dual': {'size': 5, 'dropout_input': 0.1},
                      'mos': {'components': 2}, 'dropout_embedding': 0.2},
    'alstm': {**ALSTM, 'weight_drop': 0.3},
    'alstm_static': {'cell': 'alstm', 'alstm': {'latent': 'static', 'latent_size': 3}},
    'alstm_rhn': {'cell': 'alstm', 'alstm': {'latent': 'lstm_rhn', 'latent_size': 3,
                                             'dropout_latent': 0.2}, 'weight_drop': 0.3},
    'mlstm': {'cell': 'mlstm', 'weight_drop': 0.3},
    'gru': {'cell': 'gru', 'weight_drop': 0.3},
    'flax_lstm': {'cell': 'flax_lstm', 'weight_drop': 0.3},
    'simple': {'cell': 'simple', 'weight_drop': 0.3, 'fused_recurrence': False},
    'lstm_bfloat16': {'dtype': 'bfloat16'},
    'mogrifier_bfloat16': {'dtype': 'bfloat16', 'mogrifier': {'rounds': 2, 'rank': 2}},
    'budget': {'param_budget': 2000, 'embed_ratio': 0.5, 'tie_embeddings': True},
}


def model_config(fields):
  cfg = base_config().model
  cfg.update(embed_size=4, hidden_size=6, **DROPOUT)
  cfg.update(fields)
  return cfg


def _tree(params):
  return {jax.tree_util.keystr(path): [list(x.shape), str(x.dtype)]
          for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def _sums(tree):
  """Per leaf: its sum and its sum of absolute values, in float64."""
  return {jax.tree_util.keystr(path): [float(np.sum(np.asarray(x, np.float64))),
                                       float(np.sum(np.abs(np.asarray(x, np.float64))))]
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def fingerprint(model, params, weight_drop):
  """What the model computes from `params` that depends on its parameter
  tree, its dropout masks and its scans."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (BATCH, STEPS + 1)),
                       jnp.int32)
  carries = model.initialize_carry(BATCH)

  def loss(p, train):
    logits, _ = model.apply({'params': p}, tokens[:, :-1], carries, train=train,
                            rngs={'dropout': jax.random.key(7)})
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), logits

  (train_loss, train_logits), grads = jax.value_and_grad(loss, has_aux=True)(params, True)
  eval_loss, eval_logits = loss(params, False)
  out = {'train_loss': float(train_loss), 'eval_loss': float(eval_loss),
         'train_logits': _sums({'logits': train_logits})["['logits']"],
         'eval_logits': _sums({'logits': eval_logits})["['logits']"],
         'grads': _sums(grads),
         'carries': [list(x.shape) for x in jax.tree.leaves(carries)]}
  if weight_drop:
    out['dropped'] = _sums(model.dropped_weights(params, jax.random.key(3)))
  return out


def main():
  out = {}
  for name, fields in CONFIGS.items():
    cfg = model_config(fields)
    model = build_model(cfg, VOCAB)
    params = init_params(model, jax.random.key(0), cfg.init_scale)
    out[name] = {'fields': fields, 'tree': _tree(params), 'params': _sums(params),
                 **fingerprint(model, params, cfg.weight_drop)}
    print(name, out[name]['train_loss'])
  path = pathlib.Path(__file__).with_name('fingerprints.json')
  path.write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  main()
