"""Reading traced programs: what the tests check about the operations a model runs."""


def _equations(jaxpr, in_loop: bool = False):
  """(equation, whether it runs in the body of a loop) for every equation of
  a jaxpr and of every jaxpr inside it (scans, whiles, custom VJPs, pjit
  calls, Pallas kernels), at any depth."""
  for eqn in jaxpr.eqns:
    yield eqn, in_loop
    inner_in_loop = in_loop or eqn.primitive.name in ('scan', 'while')
    for param in eqn.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(inner, 'jaxpr', inner)  # a ClosedJaxpr's jaxpr
        if hasattr(inner, 'eqns'):
          yield from _equations(inner, inner_in_loop)


def dot_equations(jaxpr) -> list:
  """The dot_general equations of a jaxpr and of every jaxpr inside it."""
  return [eqn for eqn, _ in _equations(jaxpr) if eqn.primitive.name == 'dot_general']


def loop_equations(jaxpr) -> list:
  """The equations of a jaxpr, and of every jaxpr inside it, that run in the
  body of a loop (a scan or a while), at any depth."""
  return [eqn for eqn, in_loop in _equations(jaxpr) if in_loop]


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
  return {
    eqn.params['name']: tuple(eqn.params['grid_mapping'].grid)
    for eqn, _ in _equations(jaxpr)
    if eqn.primitive.name == 'pallas_call'
  }
