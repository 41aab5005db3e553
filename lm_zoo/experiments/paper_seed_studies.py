"""Seed studies at the papers' sizes, for one GPU (`lm_zoo.tasks.seeds`,
each model's seeds trained at once):

  zaremba_medium_dyneval  Zaremba's medium LSTM (the authors' code: two gate
                          biases, the code's schedule; bfloat16 products),
                          then dynamic evaluation of each seed's best weights
                          on the whole valid and test: RMS with mean(MS) over
                          tensors as Krause's code, and SGD, each searched on
                          the first `search_tokens` of valid, the seeds
                          scored together (`dynamic.members`). Krause et al.
                          (2018) report AWD-LSTM 57.3 to 51.1 on PTB test,
                          Melis et al. (2020) the Mogrifier 50.1 to 44.8.
  mogrifier_24m           the 24M LSTM and Mogrifier recipes of the Mogrifier
                          paper (`mogrifier_paper.py:ptb_lstm`,
                          `:ptb_mogrifier`) for the same training time each
                          (`train.max_seconds`), then valid and test: the
                          paired difference over the seeds, beside the
                          paper's -3.4 perplexity at convergence.

  lm-zoo-task --config=experiments/paper_seed_studies.py:zaremba_medium_dyneval \
      --config.workdir=runs/medium_dyneval --output=runs/medium_dyneval.json

The run kit's `dyneval` and `mogrifier24m` parts run them (docs/usage.md).
The same command resumes a study: finished stacks and scores are read back.
"""

import pathlib
import runpy

import ml_collections

from lm_zoo.experiments.recipes import zaremba_config

# The sibling configs (experiments/ is not a package).
_HERE = pathlib.Path(__file__).parent
mogrifier_paper = runpy.run_path(str(_HERE / 'mogrifier_paper.py'))['get_config']
dyneval_rms = runpy.run_path(str(_HERE / 'dyneval_rms.py'))['get_config']
dyneval_sgd = runpy.run_path(str(_HERE / 'dyneval_sgd.py'))['get_config']

VARIANTS = ('zaremba_medium_dyneval', 'mogrifier_24m')
SEARCH_TOKENS = 10_000  # of valid, for each dynamic-evaluation setting
SECONDS_PER_MODEL = 240  # mogrifier_24m: each model's training time


def get_config(variant: str = 'zaremba_medium_dyneval'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = ml_collections.ConfigDict()
  c.task = 'seeds'
  if variant == 'zaremba_medium_dyneval':
    medium = zaremba_config('medium', 'code')
    medium.model.dtype = 'bfloat16'
    models = {'lstm_medium': medium}
    c.reference = 'lstm_medium'
    c.evaluations = ml_collections.ConfigDict({'rms': dyneval_rms('krause'), 'sgd': dyneval_sgd()})
    for evaluation in c.evaluations.values():
      evaluation.dynamic.search_tokens = SEARCH_TOKENS
      # Every seed's every setting in one scan, then the seeds' scores in one:
      # at batch 1 a GPU runs them in far less than one after another.
      evaluation.dynamic.members = 0
  else:
    models = {'lstm': mogrifier_paper('ptb_lstm'), 'mogrifier': mogrifier_paper('ptb_mogrifier')}
    for model in models.values():
      model.train.max_seconds = SECONDS_PER_MODEL
    c.reference = 'lstm'
  for model in models.values():
    model.generate.num_lines = 0
  c.models = ml_collections.ConfigDict(models)
  c.seeds = (0, 1, 2, 3)
  c.stack = True
  c.workdir = f'runs/{variant}'
  return c
