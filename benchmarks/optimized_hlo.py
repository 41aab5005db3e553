"""What runs inside the loops of a program as XLA optimized it (the text of
`jax.jit(f).lower(...).compile().as_text()`): the pads there, each one a
copy made at every step of its loop.

  from optimized_hlo import loop_pads
  loop_pads(train_step.lower(*args).compile().as_text())
  # ['f32[1150,4600]{1,0} -> f32[1152,4600]{1,0}', ...]
"""

from __future__ import annotations

import pathlib
import re

# A computation's header: `name {` or `ENTRY name {`, with its parameters.
_HEADER = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$')
# The computations an instruction runs: fusions, loops, calls, reductions, branches.
_CALLED = re.compile(
  r'(?:calls|body|condition|to_apply)=%?([\w.\-]+)'
  r'|branch_computations=\{([^}]*)\}'
)
_PAD = re.compile(r'= (\S+) pad\((?:\S+ )?%?([\w.\-]+), ')
_SHAPE = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ')
_LOOP_BODY = re.compile(r' while\(.*\bbody=%?([\w.\-]+)')


def computations(hlo: str) -> dict[str, list[str]]:
  """{name: its instruction lines} of every computation in `hlo`."""
  found, lines = {}, None
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      lines = found.setdefault(header.group(1), [])
    elif line.startswith('}'):
      lines = None
    elif lines is not None:
      lines.append(line)
  return found


def _called(line: str) -> list[str]:
  names = []
  for single, branches in _CALLED.findall(line):
    names += [single] if single else [b.strip().lstrip('%') for b in branches.split(',')]
  return names


def loop_pads(hlo: str) -> list[str]:
  """Every pad that runs inside a while loop's body, at any depth (in a
  fusion it calls, or a loop inside it), as 'operand shape -> result shape'."""
  comps = computations(hlo)
  inside = set()
  pending = [
    m.group(1) for lines in comps.values() for line in lines for m in [_LOOP_BODY.search(line)] if m
  ]
  while pending:
    name = pending.pop()
    if name in inside or name not in comps:
      continue
    inside.add(name)
    pending += [called for line in comps[name] for called in _called(line)]
  pads = []
  for name in sorted(inside):
    shapes = {m.group(1): m.group(2) for line in comps[name] for m in [_SHAPE.match(line)] if m}
    for line in comps[name]:
      pad = _PAD.search(line)
      if pad:
        pads.append(f'{shapes.get(pad.group(2), "?")} -> {pad.group(1)}')
  return pads


def write_hlo(built: dict, folder: str) -> dict:
  """Each recipe row's optimized train step, as text, into `folder`;
  returns {row: the pads inside its loops}."""
  path = pathlib.Path(folder)
  path.mkdir(parents=True, exist_ok=True)
  pads = {}
  for name, calls in built.items():
    if 'hlo' in calls:
      text = calls['hlo']()
      (path / f'{name.replace(":", "_").replace("@", "_")}.hlo.txt').write_text(text)
      pads[name] = loop_pads(text)
  return pads
