"""Every ```python block of docs/*.md runs, so the guide's examples are never stale.

The blocks of one file run in order in one namespace, as a reader would paste
them into one session, with the working directory a fresh temporary folder.
A block whose opening line is ```python no-run is shown but not run (for
snippets that need hardware or a cluster); use it sparingly.
"""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / 'docs'
NO_RUN = 'no-run'
# An opening fence with its info string, the code, the closing fence.
BLOCK = re.compile(r'^```([^\n]*)\n(.*?)^```[ \t]*$', re.MULTILINE | re.DOTALL)
LINK = re.compile(r'\]\(([^)#\s]+\.md)(?:#[^)]*)?\)')


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
  """(line number, code, runs) of each ```python block."""
  blocks = []
  for match in BLOCK.finditer(text):
    info = match.group(1).split()
    if info[:1] != ['python']:
      continue
    if any(word != NO_RUN for word in info[1:]):
      raise ValueError(f'unknown marker in ```{match.group(1)}: only {NO_RUN} is defined')
    line = text.count('\n', 0, match.start(2)) + 1
    blocks.append((line, match.group(2), NO_RUN not in info))
  return blocks


def test_block_extraction():
  text = 'x\n```python\na = 1\n```\n```bash\nls\n```\n```python no-run\nb = 2\n```\n'
  assert python_blocks(text) == [(3, 'a = 1\n', True), (9, 'b = 2\n', False)]
  with pytest.raises(ValueError, match='unknown marker'):
    python_blocks('```python norun\nc = 3\n```\n')


PAGES = sorted(DOCS.glob('*.md'))


def test_the_guide_exists_and_its_links_resolve():
  assert (DOCS / 'README.md').is_file()
  for page in PAGES:
    for target in LINK.findall(page.read_text()):
      if '://' not in target:
        assert (page.parent / target).resolve().is_file(), f'{page.name} links to {target}'


@pytest.fixture
def registries_restored():
  """The registries a page's examples add to (register_cell, _optimizer,
  ...) as they were before: a name a page registers ('lion') is not known
  to the tests that run after it in the same process."""
  from lm_zoo.cells import scans
  from lm_zoo.evaluation import dynamic_rules
  from lm_zoo.evaluation import registry as evaluators
  from lm_zoo.models import registry as models
  from lm_zoo.training import optimizers

  kept = [
    models.CELLS,
    models.HEADS,
    optimizers.OPTIMIZERS,
    evaluators.REGISTRY,
    evaluators.META_LEARNED,
    dynamic_rules.DYNAMIC_RULES,
    scans.REGISTRY,
  ]
  saved = [registry.copy() for registry in kept]
  yield
  for registry, before in zip(kept, saved):
    registry.clear()
    registry.update(before)


@pytest.mark.parametrize(
  'page', [p for p in PAGES if python_blocks(p.read_text())], ids=lambda p: p.name
)
@pytest.mark.usefixtures('registries_restored')
def test_examples_run(page, data_dir, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv('LM_ZOO_DATA', str(data_dir))
  namespace = {'__name__': f'docs_{page.stem}'}
  for line, code, runs in python_blocks(page.read_text()):
    if not runs:
      compile(code, f'{page.name}:{line}', 'exec')  # still valid Python
      continue
    try:
      exec(compile(code, f'{page}:{line}', 'exec'), namespace)  # noqa: S102
    except Exception as err:
      raise AssertionError(f'the block at {page.name} line {line} failed: {err!r}') from err


def _anchor(heading: str) -> str:
  """A Markdown heading's anchor as GitHub writes it."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def test_the_results_report_is_short_tells_no_history_and_its_anchors_resolve():
  report = DOCS.parent / 'WORKSPACE.md'
  text = report.read_text()
  assert len(text.splitlines()) < 700
  narration = re.findall(r'.{0,30}(?:\b(?:sessions?|issues?)\b|#\d+\b).{0,30}', text, re.IGNORECASE)
  assert not narration, narration
  anchors = {_anchor(line.lstrip('#')) for line in text.splitlines() if line.startswith('#')}
  for page in [DOCS.parent / 'README.md', *PAGES]:
    for anchor in re.findall(r'WORKSPACE\.md#([\w\-]+)', page.read_text()):
      assert anchor in anchors, f'{page.name} links to WORKSPACE.md#{anchor}'
