"""What an evaluation of a work directory keeps as it goes, so that the same
evaluation, stopped and started again, resumes: the evaluator's choice (a
tuned temperature, a dynamic-evaluation search) and each scored split, in a
folder named for a digest of everything the scores depend on
(`progress_digest`, which meta-training's progress is checked against too).

  progress = EvaluationProgress.of(folder, 'dynamic', config, run_config, params, corpus)
  record = progress.choice()             # MISSING, or what was chosen
  progress.save_choice(record)
  progress.result('valid')               # None, or the split's EvalResult
  progress.save_result('valid', result)
  progress.clear()                       # once every split is scored
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import shutil
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from lm_zoo.data import Corpus
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation import EvalResult
from lm_zoo.runs.files import write_text_atomically
from lm_zoo.version import __version__

log = logging.getLogger(__name__)

# The folder of WORKDIR/evaluations that lm-zoo-eval keeps its progress in.
PROGRESS_DIR = 'progress'
# The version of the files below; others are scored again.
PROGRESS_FORMAT = 1
CHOICE_FILE = 'choice.json'
# `choice()` when no choice was kept (None is a choice: nothing to choose).
MISSING = object()


def progress_digest(
  config: ml_collections.ConfigDict,
  run_config: ml_collections.ConfigDict,
  *trees: Any,
  leave_out: Sequence[str] = ('splits',),
) -> str:
  """A digest of lm_zoo's version, a config less its fields `leave_out` (an
  evaluation's splits: each split is kept alone), the run's config (but
  where its data is read from: the corpus' fingerprint says what it holds)
  and `trees` (the weights, the corpus' fingerprint, a meta-learner's
  parameters): equal exactly where they are."""
  fields = {k: v for k, v in config.to_dict().items() if k not in leave_out}
  run = run_config.to_dict()
  run['data'] = {**run['data'], 'data_dir': None}
  digest = hashlib.sha256(__version__.encode())
  for part in (fields, run):
    digest.update(json.dumps(part, sort_keys=True, default=repr).encode())
  for leaf in jax.tree.leaves(trees):
    array = np.asarray(leaf)
    digest.update(f'{array.dtype.str}{array.shape}'.encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class EvaluationProgress:
  """The kept choice and split results of one evaluation, in `folder`."""

  folder: pathlib.Path

  @classmethod
  def of(
    cls,
    parent: str | pathlib.Path,
    evaluator: str,
    config: ml_collections.ConfigDict,
    run_config: ml_collections.ConfigDict,
    params: Any,
    corpus: Corpus,
    *more: Any,
  ) -> EvaluationProgress:
    """The progress of evaluating `params` on `corpus` as `config` says,
    in PARENT/EVALUATOR-DIGEST (`progress_digest`; `more`: other trees
    the scores depend on)."""
    digest = progress_digest(config, run_config, params, corpus.fingerprint(), *more)
    return cls(pathlib.Path(parent) / f'{evaluator}-{digest}')

  def choice(self) -> Any:
    """The kept choice's record (`Evaluator.choice_record`), or MISSING."""
    return self._read(CHOICE_FILE, lambda kept: kept['choice'])

  def save_choice(self, record: Any) -> None:
    self._write(CHOICE_FILE, {'choice': record})

  def result(self, split: str) -> EvalResult | None:
    """The kept result of `split`, or None."""
    kept = self._read(f'{split}.json', lambda kept: EvalResult.from_record(kept['result']))
    return None if kept is MISSING else kept

  def save_result(self, split: str, result: EvalResult) -> None:
    self._write(f'{split}.json', {'result': result.to_record()})

  def check_writable(self) -> None:
    """Makes the folder, or raises a ConfigError naming what is in the way
    (before an evaluation's minutes, not after them)."""
    try:
      self.folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
      raise ConfigError(
        f'the evaluation cannot keep its progress in {self.folder} ({err.strerror}): '
        'remove what is in the way'
      ) from None

  def clear(self) -> None:
    """Removes the folder, and its parent once that is empty."""
    shutil.rmtree(self.folder, ignore_errors=True)
    try:
      self.folder.parent.rmdir()
    except OSError:  # other evaluations' progress, or gone already
      pass

  def _read(self, name: str, read: Callable[[dict], Any]) -> Any:
    """`read` of the file `name` holds, or MISSING where there is none or it
    cannot be read (what it held is then made again)."""
    path = self.folder / name
    if not path.is_file():
      return MISSING
    try:
      kept = json.loads(path.read_text())
      if kept['format'] != PROGRESS_FORMAT:
        raise ValueError(f'format {kept["format"]!r}, not {PROGRESS_FORMAT}')
      value = read(kept)
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError) as err:
      log.warning('%s cannot be read (%s: %s): making it again', path, type(err).__name__, err)
      return MISSING
    log.info('resuming with %s', path)
    return value

  def _write(self, name: str, record: dict) -> None:
    self.check_writable()
    try:
      write_text_atomically(self.folder / name, json.dumps({'format': PROGRESS_FORMAT, **record}))
    except OSError as err:
      raise ConfigError(
        f'the evaluation cannot keep its progress in {self.folder / name} ({err.strerror}): '
        'remove what is in the way'
      ) from None
