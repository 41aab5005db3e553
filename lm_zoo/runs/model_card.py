"""The README.md model card of a preset (`lm_zoo.runs.export`), written
from what the work directory recorded: its config, vocabulary, data
fingerprint, summary.json, seeds.json, evaluations/*.json and commands.txt."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import ml_collections

from lm_zoo.data import Vocab
from lm_zoo.data.corpora import SPLITS
from lm_zoo.runs.files import (
  COMMANDS_FILE,
  DATA_FILE,
  EVALUATIONS_DIR,
  SEEDS_FILE,
  SUMMARY_FILE,
)

# Trains a preset's model again from its config.json (its data from
# $LM_ZOO_DATA or the default data folder).
RETRAIN_COMMAND = 'lm-zoo-train --config=experiments/from_workdir.py:FOLDER --workdir=runs/NAME'


def _read(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _commands(workdir: pathlib.Path) -> list[str]:
  try:
    return (workdir / COMMANDS_FILE).read_text().splitlines()
  except OSError:
    return []


def _result(result: Any) -> str:
  if not isinstance(result, dict):
    return str(result)
  shown = [
    f'{name} {result[name]:.4g}'
    for name in ('perplexity', 'bpc', 'loss')
    if isinstance(result.get(name), (int, float))
  ]
  if isinstance(result.get('num_tokens'), int):
    shown.append(f'{result["num_tokens"]:,} tokens')
  return ', '.join(shown) or json.dumps(result)[:200]


def _architecture_and_data(
  config: ml_collections.ConfigDict, vocab: Vocab, record: dict, data: dict
) -> list[str]:
  """The card's sections on the model and on the data it was trained on."""
  m, d = config.model, config.data
  lines = [
    '## Architecture',
    '',
    f'- cell: {m.cell}, {m.num_layers} layers, hidden size {m.hidden_size}, '
    f'embedding size {m.embed_size}, tied embeddings: {m.tie_embeddings}',
    f'- parameters: {record["num_params"]:,}',
    '',
    '## Data and tokenisation',
    '',
    f'- corpus: {d.name}; vocabulary: {len(vocab):,} {vocab.kind} tokens '
    f'(vocab.json), BPTT {d.bptt}',
  ]
  for split in SPLITS:
    if isinstance(data.get(split), dict) and 'tokens' in data[split]:
      lines.append(f'- {split}: {data[split]["tokens"]:,} tokens')
  return lines


def _results(
  workdir: pathlib.Path, config: ml_collections.ConfigDict, record: dict, summary: dict
) -> list[str]:
  """The card's results: seeds, device, each split's scores at the end of
  training and those of the later evaluations."""
  seeds = (_read(workdir / SEEDS_FILE) or {}).get('seeds') or [config.seed]
  env = summary.get('environment') or {}
  lines = [
    '## Results',
    '',
    f'- seeds: {", ".join(str(s) for s in seeds)}; best epoch: {record["best_epoch"]}',
    f'- device: {env.get("device_kind", "not recorded")} ({env.get("backend", "?")}, '
    f'jax {env.get("jax", "?")})',
  ]
  for split in SPLITS:
    if split in summary:
      lines.append(f'- {split}: {_result(summary[split])}')
  for path in sorted((workdir / EVALUATIONS_DIR).glob('*.json')):
    saved = _read(path) or {}
    for split, result in (saved.get('results') or {}).items():
      lines.append(f'- {path.stem} evaluation, {split}: {_result(result)}')
  if not summary:
    lines.append('- no summary.json: the run had not finished when it was exported')
  return lines


def _training(workdir: pathlib.Path) -> list[str]:
  """The card's section on training the model again, with the commands that
  trained it."""
  lines = [
    '## Training',
    '',
    'config.json holds every setting of the run, its seed included; this command '
    'trains the same model again from it (FOLDER: this folder, for example '
    '`presets/NAME`):',
    '',
    f'    {RETRAIN_COMMAND}',
    '',
  ]
  commands = _commands(workdir)
  if commands:
    lines += [
      'The command lines that trained it (commands.txt of its work directory):',
      '',
      *(f'    {line}' for line in commands),
      '',
    ]
  return lines


def model_card(
  workdir: pathlib.Path, config: ml_collections.ConfigDict, vocab: Vocab, record: dict
) -> str:
  """The model card's Markdown text."""
  name = config.data.name
  lines = [
    f'# {name} {config.model.cell} language model (lm_zoo)',
    '',
    'A recurrent language model trained with lm_zoo and exported as a preset. '
    "Load it with `lm_zoo.load('THIS_FOLDER')` or any lm_zoo program's `--workdir`.",
    '',
    *_architecture_and_data(config, vocab, record, _read(workdir / DATA_FILE) or {}),
    '',
    *_results(workdir, config, record, _read(workdir / SUMMARY_FILE) or {}),
    '',
    *_training(workdir),
    '## Intended use and limitations',
    '',
    f'For research and teaching: scoring and sampling {name}-like text, and as a '
    'baseline. It knows only its vocabulary (other words are `<unk>` where the '
    'vocabulary has it), reflects the biases of its corpus, and is not meant for '
    'generating text that people rely on.',
    '',
  ]
  return '\n'.join(lines)
