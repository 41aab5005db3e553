"""lm_zoo: recurrent language models in JAX/Flax.

`lm_zoo.load(workdir)` gives a trained model ready to score and generate
text (lm_zoo/pretrained.py); the rest is imported from its modules.
"""

from lm_zoo.version import __version__  # noqa: F401 (lm_zoo.__version__)


def __getattr__(name: str):
  # Lazily, so that `import lm_zoo.optim` or `lm_zoo.cells` loads no more than they need.
  if name == 'load':
    from lm_zoo.pretrained import load

    return load
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
