"""Checks the repository's size limits, one line a breach: a Python file at most
400 lines, a function of lm_zoo/ at most 60 (its `def` to its last line). The
config builders, which list a whole config's fields, are exempt."""

import ast
import pathlib
import sys

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
CONFIG_BUILDERS = {
  ('lm_zoo/configs.py', 'base_config'),
  ('lm_zoo/experiments/recipes.py', 'lamb_config'),
}
FOLDERS = ('lm_zoo', 'tests', 'benchmarks', 'launch', 'experiments', '.ci')


def breaches(root: pathlib.Path) -> list[str]:
  found = []
  for folder in FOLDERS:
    for path in sorted((root / folder).rglob('*.py')):
      name = path.relative_to(root).as_posix()
      source = path.read_text()
      if (lines := source.count('\n')) > MAX_FILE_LINES:
        found.append(f'{name}: {lines} lines (at most {MAX_FILE_LINES}); split it')
      if folder != 'lm_zoo':
        continue
      for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          length = node.end_lineno - node.lineno + 1
          if length > MAX_FUNCTION_LINES and (name, node.name) not in CONFIG_BUILDERS:
            found.append(
              f'{name}:{node.lineno}: {node.name} is {length} lines (at most '
              f'{MAX_FUNCTION_LINES}); extract a helper'
            )
  return found


if __name__ == '__main__':
  found = breaches(pathlib.Path(__file__).resolve().parents[1])
  print('\n'.join(found) or 'layout: every file and function within its limit')
  sys.exit(1 if found else 0)
