"""The notebooks in notebooks/ run top to bottom at their smoke settings
(LM_ZOO_NOTEBOOK_SMOKE=1) in a fresh kernel and print real numbers.

The three run side by side (one kernel each, in its own folder), so the file
takes about as long as the slowest notebook.
"""

import asyncio
import math
import os
import re

import pytest
from conftest import REPO

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')

NOTEBOOKS = ('quickstart', 'composition_tour', 'results')
VOCAB_SIZE = 10_000  # PTB
NUMBER = r'([-+\w.]+)'  # as printed, nan and inf included


def kernel_env(data_dir) -> dict[str, str]:
  """The test's environment, with this checkout first on PYTHONPATH, the
  smoke settings on, and without conftest's eight simulated devices."""
  env = dict(
    os.environ,
    LM_ZOO_NOTEBOOK_SMOKE='1',
    LM_ZOO_DATA=str(data_dir),
    PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')])),
  )
  flags = env.get('XLA_FLAGS', '').replace('--xla_force_host_platform_device_count=8', '')
  env['XLA_FLAGS'] = flags.strip()
  return env


@pytest.fixture(scope='module')
def executed(data_dir, tmp_path_factory):
  """Each notebook executed by nbclient: name -> (notebook, its error or None)."""
  env = kernel_env(data_dir)
  notebooks = {
    name: nbformat.read(REPO / 'notebooks' / f'{name}.ipynb', as_version=4) for name in NOTEBOOKS
  }

  async def execute(name):
    cwd = tmp_path_factory.mktemp(name)
    client = nbclient.NotebookClient(
      notebooks[name],
      timeout=300,
      kernel_name='python3',
      resources={'metadata': {'path': str(cwd)}},
    )
    await client.async_execute(env=env)

  async def execute_all():
    return await asyncio.gather(*(execute(name) for name in NOTEBOOKS), return_exceptions=True)

  errors = asyncio.run(execute_all())
  return {name: (notebooks[name], error) for name, error in zip(NOTEBOOKS, errors)}


def ran(executed, name):
  notebook, error = executed[name]
  if error is not None:
    raise error
  return notebook


def tagged(notebook, tag):
  """The outputs of the code cell tagged `tag`."""
  cells = [c for c in notebook.cells if tag in c.metadata.get('tags', [])]
  assert len(cells) == 1, f'one cell tagged {tag!r} expected, found {len(cells)}'
  return cells[0].outputs


def stdout(outputs) -> str:
  return ''.join(o.text for o in outputs if o.output_type == 'stream' and o.name == 'stdout')


def perplexity(text: str, below: float = VOCAB_SIZE) -> float:
  """A printed perplexity: finite, and below the vocabulary size (a uniform
  guess) unless told otherwise."""
  value = float(text)
  assert math.isfinite(value) and 1.0 < value < below, value
  return value


def test_quickstart_trains_samples_and_evaluates_dynamically(executed):
  notebook = ran(executed, 'quickstart')
  trained = re.findall(
    rf'^(\w+): \d+ steps in .* valid perplexity {NUMBER}, '
    rf'test perplexity {NUMBER}$',
    stdout(tagged(notebook, 'perplexities')),
    re.MULTILINE,
  )
  assert [name for name, _, _ in trained] == ['lstm', 'mogrifier']
  for _, valid, test in trained:
    perplexity(valid), perplexity(test)

  text = stdout(tagged(notebook, 'dynamic-evaluation'))
  match = re.search(rf'static perplexity {NUMBER}, dynamic perplexity {NUMBER}', text)
  assert match, text
  static, dynamic = (perplexity(p) for p in match.groups())
  assert dynamic < static  # a barely trained model gains a lot from adapting

  lines = stdout(tagged(notebook, 'samples')).splitlines()
  assert len(lines) == 3 and all(line.startswith('the company said ') for line in lines)


def test_composition_tour_runs_every_combination(executed):
  notebook = ran(executed, 'composition_tour')
  assert 'probabilities sum to 1.0000' in stdout(tagged(notebook, 'heads'))
  text = stdout(tagged(notebook, 'dynamic-evaluation'))
  scores = dict(re.findall(rf'^(.+): perplexity {NUMBER}$', text, re.MULTILINE))
  assert len(scores) == 3, text
  # an untrained model: about the vocabulary size before it adapts
  scores = {name: perplexity(p, below=2 * VOCAB_SIZE) for name, p in scores.items()}
  static = scores.pop('static (lr 0)')
  assert all(p < static for p in scores.values()), (static, scores)


def test_results_trains_a_tiny_run_when_there_is_none_then_plots_and_tabulates(executed):
  notebook = ran(executed, 'results')
  curves = tagged(notebook, 'curves')
  assert any('image/png' in o.get('data', {}) for o in curves)
  table = [
    o.data['text/markdown']
    for o in tagged(notebook, 'summary-table')
    if o.output_type == 'execute_result'
  ]
  assert table, 'the summary table is not displayed'
  rows = table[0].splitlines()[2:]
  assert len(rows) == 1 and 'tiny_lstm' in rows[0]
  valid, test = re.findall(rf'perplexity {NUMBER}', rows[0])
  perplexity(valid), perplexity(test)
