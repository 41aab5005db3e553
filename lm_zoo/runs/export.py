"""A finished run exported as a preset (`export`): the folder a trained model
travels in, which `lm_zoo.load` and every program read as they read its
work directory (`lm_zoo.presets` describes the format).

  export('runs/small', 'presets/small', max_shard_size='2GB')
  lm_zoo.load('presets/small')
"""

from __future__ import annotations

import json
import pathlib
import shutil

import jax
from safetensors.numpy import save_file

from lm_zoo.errors import ConfigError
from lm_zoo.models import build_model, init_params
from lm_zoo.presets import (
  CARD_FILE,
  INDEX_FILE,
  PRESET_FILE,
  PRESET_FORMAT_VERSION,
  WEIGHTS_FILE,
  flat_params,
  parse_size,
  split_shards,
  write_sums,
)
from lm_zoo.runs.files import DATA_FILE, VOCAB_FILE
from lm_zoo.runs.finished import best_params, load_config, load_vocab
from lm_zoo.runs.model_card import model_card
from lm_zoo.runs.workdir import save_config
from lm_zoo.version import FORMAT_KEY, WRITER_KEY, __version__


def export(
  workdir: str | pathlib.Path, output: str | pathlib.Path, max_shard_size: str | int = '2GB'
) -> pathlib.Path:
  """Writes the preset of `workdir`'s best weights to `output`, a new or
  empty folder; weights above `max_shard_size` (`parse_size`) are sharded.

  Raises:
    ConfigError: `workdir` is no finished work directory, or `output` is a
      file or a folder with files in it.
  """
  workdir, output = pathlib.Path(workdir), pathlib.Path(output)
  max_bytes = parse_size(max_shard_size)
  if not workdir.is_dir():
    raise ConfigError(
      f'--workdir={workdir} is not a folder: name the work directory of a run lm-zoo-train finished'
    )
  if output.exists() and (not output.is_dir() or any(output.iterdir())):
    raise ConfigError(
      f'--output={output} is {"a file" if not output.is_dir() else "not empty"}'
      ': export into a new or empty folder'
    )
  config, vocab = load_config(workdir), load_vocab(workdir)
  model = build_model(config.model, len(vocab))
  like = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  params, meta = best_params(workdir, like)
  arrays = flat_params(params)
  output.mkdir(parents=True, exist_ok=True)
  # The run's data folder is a path on the machine that trained it: the
  # preset's reader names its own (--data_dir, $LM_ZOO_DATA).
  config.data.data_dir = ''
  save_config(config, output)
  for name in (VOCAB_FILE, DATA_FILE):
    shutil.copyfile(workdir / name, output / name)
  shards = split_shards(arrays, max_bytes)
  if len(shards) == 1:
    save_file(arrays, str(output / WEIGHTS_FILE), metadata={'format': 'np'})
  else:
    weight_map = {}
    for k, shard in enumerate(shards, 1):
      name = f'model-{k:05d}-of-{len(shards):05d}.safetensors'
      save_file(shard, str(output / name), metadata={'format': 'np'})
      weight_map.update(dict.fromkeys(shard, name))
    index = {
      'metadata': {'total_size': sum(a.nbytes for a in arrays.values())},
      'weight_map': weight_map,
    }
    (output / INDEX_FILE).write_text(json.dumps(index, indent=2))
  record = {
    FORMAT_KEY: PRESET_FORMAT_VERSION,
    WRITER_KEY: __version__,
    'best_epoch': meta.get('epoch'),
    'num_params': sum(a.size for a in arrays.values()),
  }
  (output / PRESET_FILE).write_text(json.dumps(record, indent=2))
  (output / CARD_FILE).write_text(model_card(workdir, config, vocab, record))
  write_sums(output)
  return output
