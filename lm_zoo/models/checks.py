"""`check_model_config`: every check of a model config (`config.model`,
fields in lm_zoo/configs.py) that needs no data, written once: `build_model`
runs it, and `lm_zoo.training.validate_config` with the rest of a config.
"""

from __future__ import annotations

import math

import ml_collections

from lm_zoo.cells.scans import SCANS
from lm_zoo.configs import base_config, check_fields, field_error, field_value
from lm_zoo.models.assembly import assemble
from lm_zoo.models.init_schemes import INIT_SCHEMES, RULE_SCHEMES, refusal
from lm_zoo.models.registry import CELLS, DTYPES, HEADS, LATENTS, LSTM_FAMILY
from lm_zoo.models.sizes import embed_size

# field -> the names it may take (the registries themselves, so that a name
# registered later is known)
CHOICES = {
  'init': INIT_SCHEMES,
  'cell': CELLS,
  'alstm.latent': LATENTS,
  'dtype': DTYPES,
  'scan': SCANS,
  'head': HEADS,
}
SIZES = (
  'num_layers',
  'hidden_size',
  'embed_size',
  'output_size',
  'alstm.latent_size',
  'dual.size',
  'mos.components',
  'mogrifier.rounds',
  'mogrifier.rank',
)
RULES = (
  (
    ('num_layers', 'hidden_size', 'unroll', 'alstm.latent_size', 'mos.components'),
    lambda x: x >= 1,
    'at least 1',
  ),
  (
    ('embed_size', 'param_budget', 'output_size', 'mogrifier.rounds', 'dual.size'),
    lambda x: x >= 0,
    '>= 0',
  ),
  (
    (
      'dropout_embedding',
      'dropout_input',
      'dropout_hidden',
      'dropout_state',
      'dropout_output',
      'weight_drop',
      'dual.dropout_input',
      'dual.dropout_output',
      'mos.dropout_latent',
      'alstm.dropout_latent',
    ),
    lambda x: 0 <= x < 1,
    'in [0, 1) (a rate of 1 would drop or keep everything)',
  ),
  (('init_scale',), lambda x: 0 <= x < math.inf, "a number >= 0 (> 0 with model.init='uniform')"),
  (SIZES, lambda x: x < 2**31, 'below 2**31'),
)


def check_model_config(cfg: ml_collections.ConfigDict) -> None:
  """Raises ConfigError on the first field of the model config `cfg` that
  cannot build a model: an unknown name, a size or rate out of range, a
  field the chosen cell or head does not take, a Mogrifier rank larger than
  the matrices it factorises, an LSTM-RHN wiring that cannot be."""
  check_fields(cfg, CHOICES, RULES, section='model')
  if cfg.cap_input_gate and cfg.cell not in LSTM_FAMILY:
    raise field_error(
      'model.cap_input_gate',
      True,
      f'applies to the cells {", ".join(LSTM_FAMILY)}, not '
      f'model.cell={cfg.cell!r}: set it False or choose one of them',
    )
  if cfg.recurrent_bias and cfg.cell != 'lstm':
    raise field_error(
      'model.recurrent_bias',
      True,
      f"applies to model.cell='lstm', not model.cell={cfg.cell!r}: set it False",
    )
  _check_head_sections(cfg)
  _check_sizes(cfg)
  if cfg.cell == 'alstm' and cfg.alstm.latent == 'lstm_rhn':
    _check_lstm_rhn(cfg)
  _check_init(cfg)


def _check_init(cfg: ml_collections.ConfigDict) -> None:
  """The scheme's scale, and the parts of the model it draws (its parts
  assembled at the configured hidden size: the sizes the rules read do not
  depend on a budget's)."""
  if cfg.init == 'uniform' and not cfg.init_scale > 0:
    raise field_error('model.init_scale', cfg.init_scale, "must be > 0 under model.init='uniform'")
  if cfg.init != 'uniform' and cfg.init_scale != 0:
    raise field_error(
      'model.init_scale',
      cfg.init_scale,
      f"applies to model.init='uniform' only (model.init={cfg.init!r}): set it 0",
    )
  if cfg.init in RULE_SCHEMES:
    reason = refusal(assemble(cfg, 2, cfg.hidden_size), cfg.init)
    if reason:
      raise field_error('model.init', cfg.init, reason)


def _check_head_sections(cfg: ml_collections.ConfigDict) -> None:
  """A head's own section changed while another head is chosen would be
  silently ignored."""
  defaults = base_config().model
  for name, spec in HEADS.items():
    if name == cfg.head or spec.section is None or spec.section not in defaults:
      continue
    section, default = cfg[spec.section].to_dict(), defaults[spec.section].to_dict()
    for field in section:
      if section[field] != default.get(field):
        raise field_error(
          f'model.{spec.section}.{field}',
          section[field],
          f'configures the {name!r} head, but model.head={cfg.head!r}: set '
          f'--config.model.head={name}, or leave model.{spec.section} alone',
        )


def _check_sizes(cfg: ml_collections.ConfigDict) -> None:
  if (
    cfg.skip_connections
    and cfg.num_layers > 1
    and cfg.output_size
    and (cfg.param_budget or cfg.output_size != cfg.hidden_size)
  ):
    raise field_error(
      'model.skip_connections',
      True,
      "sums the layers' outputs, which needs "
      f'layers of one size, but model.output_size={cfg.output_size} sets the '
      'last one apart: set model.output_size=0',
    )
  mogrifier = cfg.mogrifier
  if mogrifier.rounds > 0 and mogrifier.rank > 0 and cfg.param_budget == 0:
    # Q^i, R^i map between each layer's input and hidden state (Melis et al. 2020).
    sizes = {
      'model.embed_size': embed_size(cfg, cfg.hidden_size),
      'model.hidden_size': cfg.hidden_size,
    }
    if cfg.output_size:
      sizes['model.output_size'] = cfg.output_size
    field = min(sizes, key=sizes.get)
    if mogrifier.rank > sizes[field]:
      raise field_error(
        'model.mogrifier.rank',
        mogrifier.rank,
        f'is larger than the matrices it factorises ({field} is {sizes[field]}): '
        f'a rank of at most {sizes[field]}, or 0 for full rank, is meaningful',
      )


def _check_lstm_rhn(cfg: ml_collections.ConfigDict) -> None:
  """The LSTM-RHN steps the aLSTM layers together (Flennerhag et al., eq. 9)."""
  for field, allowed, why in (
    ('mogrifier.rounds', 0, 'takes no Mogrifier rounds (model.alstm.latent=lstm does)'),
    ('variational_dropout', True, 'has variational dropout only'),
    ('skip_connections', False, 'steps the layers together and has no skip connections'),
  ):
    if field_value(cfg, field) != allowed:
      raise field_error(
        f'model.{field}',
        field_value(cfg, field),
        f'does not go with model.alstm.latent=lstm_rhn, which {why}: set it to {allowed}',
      )
