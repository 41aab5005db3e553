"""Hostile arguments to the Python API that need no trained model: each is
refused by a ValueError (an lm_zoo error where it is about a file) whose one
line names the argument and what it must be."""

import pytest

import lm_zoo
from lm_zoo.cells import LSTMCell
from lm_zoo.data import load_corpus
from lm_zoo.optim import dynamic_rms, dynamic_sgd

# id -> (call(tmp_path), what the error's line says; {t} is tmp_path)
CASES = {
  'load(None)': (
    lambda t: lm_zoo.load(None),
    'workdir must name a work directory written by lm-zoo-train, a preset or its URL, got None',
  ),
  'load(123)': (
    lambda t: lm_zoo.load(123),
    'workdir must name a work directory written by lm-zoo-train, a preset or its URL, got 123',
  ),
  "load('')": (
    lambda t: lm_zoo.load(''),
    "workdir must name a work directory written by lm-zoo-train, a preset or its URL, got ''",
  ),
  'load(a file)': (
    lambda t: lm_zoo.load(t / 'file.txt'),
    'is {t}/file.txt a work directory written by lm-zoo-train?',
  ),
  'load(a missing folder)': (lambda t: lm_zoo.load(t / 'nope'), '{t}/nope/config.json not found'),
  "dynamic_sgd('0.1')": (
    lambda t: dynamic_sgd('0.1'),
    "learning_rate must be a number >= 0, got '0.1'",
  ),
  'dynamic_sgd(True)': (
    lambda t: dynamic_sgd(True),
    'learning_rate must be a number >= 0, got True',
  ),
  'dynamic_sgd(inf)': (
    lambda t: dynamic_sgd(float('inf')),
    'learning_rate must be a number >= 0, got inf',
  ),
  'dynamic_sgd(decay=-inf)': (
    lambda t: dynamic_sgd(0.1, float('-inf')),
    'decay must be a number >= 0, got -inf',
  ),
  'dynamic_rms(eps NaN)': (lambda t: dynamic_rms(0.1, 0.0, float('nan'), {}), 'eps'),
  'LSTMCell(0)': (lambda t: LSTMCell(0), 'features must be a whole number >= 1, got 0'),
  'LSTMCell(2.5)': (lambda t: LSTMCell(2.5), 'features must be a whole number >= 1, got 2.5'),
  'load_corpus(an unknown corpus)': (
    lambda t: load_corpus('nope', t),
    "unknown corpus 'nope': choose one of ptb",
  ),
  'load_corpus(a file as the folder)': (
    lambda t: load_corpus('ptb', t / 'file.txt'),
    'data folder {t}/file.txt is a file, not a folder',
  ),
}


@pytest.mark.parametrize('case', CASES)
def test_a_hostile_argument_is_one_line_naming_it(case, tmp_path):
  (tmp_path / 'file.txt').write_text('not a folder')
  call, expected = CASES[case]
  with pytest.raises(ValueError) as refused:
    call(tmp_path)
  message = str(refused.value)
  assert expected.format(t=tmp_path) in message and '\n' not in message
