"""Reading traced programs: what the tests check about the operations a model runs."""


def dot_equations(jaxpr) -> list:
  """The dot_general equations of a jaxpr and of every jaxpr inside it (scans,
  custom VJPs, pjit calls)."""
  dots = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      dots.append(eqn)
    for param in eqn.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(inner, 'jaxpr', inner)  # a ClosedJaxpr's jaxpr
        if hasattr(inner, 'eqns'):
          dots += dot_equations(inner)
  return dots


def loop_equations(jaxpr, inside: bool = False) -> list:
  """The equations of a jaxpr, and of every jaxpr inside it, that run in the
  body of a loop (a scan or a while), at any depth."""
  found = []
  for eqn in jaxpr.eqns:
    if inside:
      found.append(eqn)
    in_loop = inside or eqn.primitive.name in ('scan', 'while')
    for param in eqn.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(inner, 'jaxpr', inner)
        if hasattr(inner, 'eqns'):
          found += loop_equations(inner, in_loop)
  return found


def summed_sizes_in_loops(jaxpr) -> list[int]:
  """The summed (contracting) axis' size of every product inside a loop."""
  sizes = []
  for eqn in loop_equations(jaxpr):
    if eqn.primitive.name == 'dot_general':
      (contracting, _), _ = eqn.params['dimension_numbers']
      sizes += [eqn.invars[0].aval.shape[axis] for axis in contracting]
  return sizes


def pallas_grids(jaxpr) -> dict[str, tuple]:
  """{name: grid} of every pallas_call in a jaxpr, at any depth."""
  grids = {}
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'pallas_call':
      grids[eqn.params['name']] = tuple(eqn.params['grid_mapping'].grid)
    for param in eqn.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(inner, 'jaxpr', inner)
        if hasattr(inner, 'eqns'):
          grids.update(pallas_grids(inner))
  return grids
