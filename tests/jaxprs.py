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
