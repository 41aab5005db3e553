"""Every command the README, the results report, docs/, the Makefile, the
launch scripts and the modules' docstrings give (`doc_commands`) names flags
its program defines, and its --config (or --tune) file, variant and
--config.FIELD=VALUE overrides load as the program would load them: a
renamed flag or config field fails here, not in a reader's terminal.
A placeholder (W, VARIANT, SEED, ..., $OUT) is checked for its flag's name
or field only (a placeholder variant: against the default one). A value of
a program's own integer, float or bool flag must be one absl's parser takes
(within a lower bound its source writes out)."""

import ast
import functools
import pathlib
import re
import tomllib
from typing import Any

import pytest
from absl import flags
from doc_commands import REPO, Command, commands_in, documented_commands
from ml_collections import config_flags

from lm_zoo.cli import HELP_FLAGS

DEFINED = re.compile(r"DEFINE_\w+\(\s*'(\w+)'")
CONFIG_FILE = re.compile(
  r"DEFINE_config_file\(\s*'(\w+)',\s*(?:str\(cli\.EXPERIMENTS / '([\w.]+)'\)|None)"
)
# A value a reader fills in: an upper-case word, an ellipsis, a glob, a shell variable.
PLACEHOLDER = re.compile(r'\b[A-Z][A-Z_]*\b|\.\.\.|[*$\[]')


@functools.cache
def _program_source(program: str) -> tuple[str, ...]:
  """The sources that define `program`'s flags: its lm_zoo/cli module with
  the flags every program shares, or a benchmark's own file."""
  if program.startswith('benchmarks/'):
    return ((REPO / program).read_text(),)
  if program.startswith('launch/'):
    function = re.search(r'programs\.(\w+)\(\)', (REPO / program).read_text()).group(1)
  else:
    scripts = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['scripts']
    function = scripts[program].split(':')[1]
  programs = (REPO / 'lm_zoo' / 'programs.py').read_text()
  module = re.search(rf"def {function}\(\) -> None:\n  _launch\('(\w+)'\)", programs).group(1)
  cli = REPO / 'lm_zoo' / 'cli'
  return ((cli / f'{module}.py').read_text(), (cli / '__init__.py').read_text())


@functools.cache
def _flag_kinds(program: str) -> dict[str, tuple[str, Any]]:
  """`program`'s flags that take a typed value: name -> (its kind,
  'integer', 'float' or 'bool', and its literal lower bound or None)."""
  kinds = {}
  for source in _program_source(program):
    for call in ast.walk(ast.parse(source)):
      kind = getattr(getattr(call, 'func', None), 'attr', '').removeprefix('DEFINE_')
      if isinstance(call, ast.Call) and kind in ('integer', 'float', 'bool'):
        bound = {k.arg: k.value for k in call.keywords}.get('lower_bound')
        kinds[ast.literal_eval(call.args[0])] = (kind, bound and ast.literal_eval(bound))
  return kinds


def _value_problem(program: str, name: str, value: str | None) -> str | None:
  """What absl's parser would say of `value` for the flag `name` of `program`."""
  kind, bound = _flag_kinds(program).get(name.removeprefix('no'), (None, None))
  if kind is None or (value is not None and PLACEHOLDER.search(value)):
    return None
  if kind == 'bool' and value is None:
    return None
  parser = {
    'integer': lambda: flags.IntegerParser(lower_bound=bound),
    'float': lambda: flags.FloatParser(lower_bound=bound),
    'bool': flags.BooleanParser,
  }[kind]()
  try:
    parser.parse(value or '')
  except ValueError as err:
    return f'--{name}={value or ""}: {err}'
  return None


def _absl_flags() -> set[str]:
  """The flags absl gives every program (logging's, --help's)."""
  defined = {
    n for n in flags.FLAGS if flags.FLAGS.find_module_defining_flag(n, '').startswith('absl')
  }
  return defined | {name.lstrip('-') for name in HELP_FLAGS}


def _flag_names(program: str) -> tuple[set[str], dict[str, str | None]]:
  """`program`'s flag names, and its config-file flags with their default
  file under experiments/ (None: required)."""
  sources = _program_source(program)
  names = {name for source in sources for name in DEFINED.findall(source)}
  configs = {name: default or None for s in sources for name, default in CONFIG_FILE.findall(s)}
  return names | configs.keys() | _absl_flags(), configs


def _flags_given(args: tuple[str, ...]) -> list[tuple[str, str | None]]:
  """(name, value) of each flag in `args`, as absl reads them: -name or
  --name, =VALUE or the next word (None: none given)."""
  given = []
  for i, arg in enumerate(args):
    if re.match(r'--?[A-Za-z]', arg):
      name, equals, value = arg.lstrip('-').partition('=')
      if not equals:
        following = args[i + 1] if i + 1 < len(args) else ''
        value = following if following and not following.startswith('-') else None
      given.append((name, value))
  return given


def _problems(command: Command) -> list[str]:
  """What in `command` its program would refuse."""
  if PLACEHOLDER.fullmatch(pathlib.Path(command.program).stem):
    return []  # launch/NAME.py: any program
  if not (command.program.startswith('lm-zoo-') or (REPO / command.program).is_file()):
    return [f'{command.program} does not exist']
  names, configs = _flag_names(command.program)
  problems, given = [], {}
  for name, value in _flags_given(command.args):
    head = name.split('.')[0]
    if name not in names and not (name.startswith('no') and name[2:] in names):
      if head not in configs or '.' not in name:
        problems.append(f'--{name} is no flag of {command.program}')
        continue
    if head in configs:
      given.setdefault(head, []).append((name, value or ''))
    else:
      problems += filter(None, [_value_problem(command.program, name, value)])
  for head, default in configs.items():
    problems += _config_problems(head, default, given.get(head, []))
  return problems


def _config_problems(head: str, default: str | None, given: list) -> list[str]:
  """Loads the --HEAD file with its overrides as absl would. A placeholder
  variant loads the default one, and placeholder values are checked for
  the field only."""
  path = next((value for name, value in given if name == head), None)
  path = path or (f'experiments/{default}' if default else None)
  if path is None:
    return []
  file, colon, variant = path.partition(':')
  if PLACEHOLDER.search(file):
    return []  # experiments/NAME.py: any config
  if not (REPO / file).is_file():
    return [f'--{head}={path}: {file} does not exist']
  if pathlib.Path(file).name == 'from_workdir.py':
    return []  # its variant is a run's folder
  path = file if PLACEHOLDER.search(variant) else path
  overrides = [(n, v) for n, v in given if n != head]
  args = [f'--{head}={REPO / path}']
  args += [f'--{n}={v}' for n, v in overrides if not PLACEHOLDER.search(v)]
  values = flags.FlagValues()
  # The overrides' flags are defined from the command line, as at a program's start.
  config_flags.DEFINE_config_file(
    head, flag_values=values, lock_config=True, sys_argv=['program', *args]
  )
  try:
    values(['program', *args])
    config = values[head].value
  except Exception as err:  # what the program would print as its error
    return [f'--{head}={path}: {str(err).splitlines()[0]}']
  problems = []
  for name, _ in overrides:
    node = config
    for field in name.split('.')[1:]:
      if field not in node:
        problems.append(f'--{name}: {path} has no field {field!r}')
        break
      node = node[field]
  return problems


COMMANDS = documented_commands()


def test_the_documented_commands_are_found():
  """The search sees the calls of every kind of page, so the test below
  cannot pass by finding none."""
  programs = {command.program for command in COMMANDS}
  assert {'lm-zoo-train', 'lm-zoo-eval', 'lm-zoo-tune', 'launch/train.py'} <= programs
  assert len(COMMANDS) > 150
  wheres = {command.where.split(':')[0] for command in COMMANDS}
  assert {'README.md', 'WORKSPACE.md', 'docs/usage.md', 'lm_zoo/cli/evaluate.py'} <= wheres


@pytest.mark.parametrize('command', COMMANDS, ids=lambda c: c.where)
def test_a_documented_command_takes_its_flags_and_config(command):
  assert not _problems(command), f'{command.where}: {" ".join(command.args)}'


def test_a_stale_flag_field_file_or_variant_is_found(tmp_path):
  page = tmp_path / 'page.md'
  page.write_text(
    'Run `lm-zoo-eval --workdir=W --dyneval=sgd` or\n'
    '```\nlm-zoo-eval --workdir=runs/x --config=experiments/dyneval_sgd.py \\\n'
    '    --config.dynamic.rate=0.1  # a comment\n'
    'launch/train.py --config=experiments/default.py:large\n'
    'lm-zoo-tune --tune=experiments/tune_dyneval.py --tune.study.num_trials=N\n'
    'train.py --config experiments/no_such_config.py\n'
    'lm-zoo-train -config=experiments/seed_study.py:VARIANT --config.models.none=1\n'
    'lm-zoo-generate --workdir=W --num_tokens=ten --verbose=yes --top_k=K\n'
    'lm-zoo-plot --figure=curves --num_tokens=0 --noverbose\n```\n'
  )
  commands = sorted(commands_in(page), key=lambda c: int(c.where.split(':')[1]))
  programs = ['lm-zoo-eval', 'lm-zoo-eval', 'launch/train.py', 'lm-zoo-tune', 'launch/train.py']
  programs += ['lm-zoo-train', 'lm-zoo-generate', 'lm-zoo-plot']
  assert [c.program for c in commands] == programs
  problems = [_problems(c) for c in commands]
  assert problems[0] == ['--dyneval is no flag of lm-zoo-eval']
  assert len(problems[1]) == 1 and 'rate' in problems[1][0]
  assert len(problems[2]) == 1 and 'large' in problems[2][0]
  assert problems[3] == []  # N: a placeholder, its field exists
  assert problems[4] == [
    '--config=experiments/no_such_config.py: experiments/no_such_config.py does not exist'
  ]
  assert len(problems[5]) == 1 and 'none' in problems[5][0]  # against the default variant
  assert [p.split(':')[0] for p in problems[6]] == ['--num_tokens=ten', '--verbose=yes']
  assert len(problems[7]) == 1 and problems[7][0].startswith('--num_tokens=0: ')
