"""The commands that the README, the results report, docs/ and the programs'
and configs' docstrings give: each program call found in their code, with
its flags, so that tests/test_doc_commands.py can check every flag against
the program that reads it."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import shlex

REPO = pathlib.Path(__file__).resolve().parents[1]

# Code in Markdown: fenced blocks, then inline spans (which may wrap lines).
FENCE = re.compile(r'^```[^\n]*\n(.*?)^```[ \t]*$', re.MULTILINE | re.DOTALL)
SPAN = re.compile(r'`([^`]+)`')
# A program: an installed console script, or a launch/ or benchmarks/ script.
PROGRAM = re.compile(r'(?:^|/)(lm-zoo-[a-z-]+|(?:launch|benchmarks)/\w+\.py)$')
# What ends a program's arguments on a shell line.
SHELL_BREAKS = {'|', ';', '&&', '||', '>', '>>', '2>&1', '&', 'then', 'do'}


@dataclasses.dataclass(frozen=True)
class Command:
  """One program call: where it is written, the program (`lm-zoo-eval`,
  `launch/train.py`, `benchmarks/accelerator_speed.py`) and its arguments."""

  where: str
  program: str
  args: tuple[str, ...]


def _logical_lines(first: int, block: str) -> list[tuple[int, str]]:
  """(line, text) of each shell line of a block, a continued line joined
  and comments dropped."""
  lines, start, pending = [], first, ''
  for number, text in enumerate(block.splitlines(), first):
    if not pending:
      start = number
    pending += re.sub(r'(^|\s)#.*', '', text)
    if pending.endswith('\\'):
      pending = pending[:-1] + ' '
      continue
    lines.append((start, pending))
    pending = ''
  return lines + ([(start, pending)] if pending else [])


def code_of(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, code) of each shell line a reader copies from `path`: the lines
  of a Markdown page's fenced blocks and its inline spans (a span's line
  breaks are the page's wrapping), the lines of a Python file's module
  docstring."""
  text = path.read_text()
  if path.suffix == '.py':
    return _logical_lines(1, ast.get_docstring(ast.parse(text)) or '')
  if path.suffix != '.md':  # the Makefile, a shell script: all code
    return _logical_lines(1, text)
  pieces = []
  for match in FENCE.finditer(text):
    pieces += _logical_lines(text.count('\n', 0, match.start(1)) + 1, match.group(1))
  outside = FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), text)
  for match in SPAN.finditer(outside):
    pieces.append((outside.count('\n', 0, match.start(1)) + 1, match.group(1).replace('\n', ' ')))
  return pieces


def _words(line: str) -> list[str]:
  try:
    return shlex.split(line)
  except ValueError:  # an unbalanced quote in prose: the words as written
    return line.split()


def _launched(word: str) -> str:
  return f'launch/{word}' if '/' not in word and (REPO / 'launch' / word).is_file() else word


def commands_in(path: pathlib.Path) -> list[Command]:
  """Every program call in `path`'s code, with the arguments up to the end
  of its shell command. A launch/ script named bare (`train.py --flag`)
  counts as called."""
  found = []
  for line, code in code_of(path):
    words = [_launched(word) for word in _words(code)]
    for i, word in enumerate(words):
      program = PROGRAM.search(word)
      if program is None:
        continue
      args = []
      for arg in words[i + 1 :]:
        if arg in SHELL_BREAKS or PROGRAM.search(arg):
          break
        args.append(arg)
      where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
      found.append(Command(f'{where}:{line}', program.group(1), tuple(args)))
  return found


def documented_commands() -> list[Command]:
  """The calls in README.md, WORKSPACE.md, docs/*.md, the Makefile, the
  launch/ shell scripts and the module docstrings of lm_zoo/, launch/,
  experiments/ and benchmarks/."""
  paths = [REPO / 'README.md', REPO / 'WORKSPACE.md', *sorted((REPO / 'docs').glob('*.md'))]
  paths += [REPO / 'Makefile', *sorted((REPO / 'launch').glob('*.sh'))]
  paths += sorted((REPO / 'lm_zoo').rglob('*.py'))
  for folder in ('launch', 'experiments', 'benchmarks'):
    paths += sorted((REPO / folder).glob('*.py'))
  return [command for path in paths for command in commands_in(path)]
