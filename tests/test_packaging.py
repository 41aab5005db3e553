"""lm_zoo installed from its wheel, not from the checkout: the programs and
their configs work from any folder (the Colab cell's `pip install`)."""

import pathlib
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """lm_zoo from a wheel built from the checkout, in a folder of its own
  (its dependencies are this environment's)."""
  folder = tmp_path_factory.mktemp('install')
  subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      'wheel',
      '--no-deps',
      '-q',
      '-w',
      str(folder / 'wheel'),
      str(REPO),
    ],
    check=True,
    capture_output=True,
  )
  [wheel] = (folder / 'wheel').glob('lm_zoo-*.whl')
  subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      'install',
      '--no-deps',
      '-q',
      '--target',
      str(folder / 'site'),
      str(wheel),
    ],
    check=True,
    capture_output=True,
  )
  return folder / 'site'


def _program(site: pathlib.Path, program: str, args: list[str], cwd: pathlib.Path, env):
  """Runs an installed program as its console script does, from `cwd`."""
  code = (
    f'import sys; sys.argv = ["lm-zoo-{program}", *sys.argv[1:]]; '
    f'import lm_zoo, lm_zoo.programs as p; print("lm_zoo at", lm_zoo.__file__); '
    f'p.{program.replace("-", "_")}()'
  )
  return subprocess.run(
    [sys.executable, '-c', code, *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=600,
    env={**env, 'PYTHONPATH': str(site)},
  )


def test_the_installed_programs_train_and_evaluate_outside_the_checkout(
  installed, data_dir, tmp_path
):
  import os

  env = {**os.environ, 'LM_ZOO_DATA': str(data_dir)}
  tiny = [
    '--config.data.train_tokens=401',
    '--config.data.valid_tokens=121',
    '--config.data.test_tokens=91',
    '--config.data.batch_size=4',
    '--config.data.bptt=10',
    '--config.data.eval_batch_size=3',
    '--config.model.embed_size=8',
    '--config.model.hidden_size=8',
    '--config.generate.num_lines=0',
  ]
  # The README's config path, from a folder without experiments/ in it.
  trained = _program(
    installed, 'train', ['--config=experiments/default.py', '--workdir=run', *tiny], tmp_path, env
  )
  assert trained.returncode == 0, trained.stderr[-2000:]
  assert f'lm_zoo at {installed}' in trained.stdout
  assert (tmp_path / 'run' / 'summary.json').is_file()
  scored = _program(
    installed,
    'evaluate',
    ['--workdir=run', '--config=experiments/evaluate.py:static'],
    tmp_path,
    env,
  )
  assert scored.returncode == 0 and 'test: perplexity' in scored.stdout, scored.stderr[-2000:]
  # Generation needs no data: the run carries its vocabulary.
  generated = _program(
    installed,
    'generate',
    ['--workdir=run', '--num_tokens=3'],
    tmp_path,
    {**env, 'LM_ZOO_DATA': str(tmp_path / 'nothing')},
  )
  assert generated.returncode == 0, generated.stderr[-2000:]


def test_the_library_imports_no_optional_dependency():
  """A user of the cells, models, transforms or training loop installs no
  database layer, plotting or TensorBoard (pyproject.toml's extras)."""
  code = (
    'import sys, lm_zoo.cells, lm_zoo.models, lm_zoo.optim, lm_zoo.training, '
    'lm_zoo.evaluation, lm_zoo.pretrained; from lm_zoo.errors import OPTIONAL_MODULES; '
    'print(sorted(m for m in OPTIONAL_MODULES if m in sys.modules))'
  )
  imported = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=300, check=True
  )
  assert imported.stdout.strip() == '[]'


@pytest.mark.parametrize(
  'program, module, extra', [('tune', 'optuna', 'tune'), ('plot', 'matplotlib', 'plot')]
)
def test_a_program_without_its_extra_names_the_extra(program, module, extra, tmp_path):
  # As if `module` were not installed: its import raises ModuleNotFoundError.
  code = (
    f'import sys; sys.modules[{module!r}] = None; sys.argv = ["lm-zoo-{program}", '
    f'*sys.argv[1:]]; import lm_zoo.programs as p; p.{program}()'
  )
  (tmp_path / 'metrics.jsonl').write_text(
    '{"kind": "valid", "step": 1, "epoch": 1, "loss": 4.0, "perplexity": 54.6}\n'
  )
  args = {
    'tune': ['--tune=experiments/tune_ptb_small.py', f'--workdir={tmp_path}'],
    'plot': ['--figure=curves', f'--workdirs={tmp_path}', f'--output={tmp_path}/plot.png'],
  }[program]
  stopped = subprocess.run(
    [sys.executable, '-c', code, *args], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert stopped.returncode == 1
  [line] = stopped.stderr.strip().splitlines()
  assert line.startswith('error: ') and module in line, line
  assert line.endswith(f"pip install 'lm_zoo[{extra}]'"), line


def test_lm_zoo_tune_explains_its_flags_without_the_tune_extra():
  code = (
    'import sys; sys.modules["optuna"] = sys.modules["sqlalchemy"] = None; '
    'sys.argv = ["lm-zoo-tune", "--help"]; import lm_zoo.programs as p; p.tune()'
  )
  shown = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert 'Traceback' not in shown.stderr and 'error' not in shown.stderr
  for text in ('Tunes hyper-parameters with Optuna', '--tune', '--workdir', '--report_only'):
    assert text in shown.stdout, text


def test_texts_an_installed_user_reads_name_the_programs_not_the_checkout_s_scripts():
  """Help texts, messages and config docstrings travel in the wheel, where
  launch/ does not: a paragraph of them that names a launch/ script names
  the lm-zoo-* program too (the modules behind the launch/ scripts aside)."""
  import ast

  behind_launch = {'programs.py', 'cli/__init__.py'}
  found = []
  for path in sorted((REPO / 'lm_zoo').rglob('*.py')):
    name = path.relative_to(REPO / 'lm_zoo').as_posix()
    if name in behind_launch:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        found += [
          f'{name}: {paragraph.strip()}'
          for paragraph in node.value.split('\n\n')
          if 'launch/' in paragraph and 'lm-zoo-' not in paragraph
        ]
  assert not found, found
