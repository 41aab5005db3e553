"""The generic figures: lines and points, and trials on parallel coordinates."""

import numpy as np
import pytest
from test_plots import png_size

from lm_zoo import drawing
from lm_zoo.errors import ConfigError


def test_line_figure_draws_its_data(tmp_path):
  """Read back by matplotlib's own PNG decoder: the same data draws the same
  pixels, other data other pixels, and the lines are not the background."""
  from matplotlib import image

  def draw(ys, name):
    path = drawing.line_figure(
      {'a': ([1, 2, 3], ys)},
      tmp_path / 'sub' / name,
      xlabel='x',
      ylabel='y',
      points={'p': (2, 2.5)},
      hlines={'h': 1.5},
      logy=True,
    )
    return image.imread(path)

  first, again, other = (
    draw([3.0, 2.0, 1.0], 'a.png'),
    draw([3.0, 2.0, 1.0], 'b.png'),
    draw([1.0, 2.0, 3.0], 'c.png'),
  )
  assert first.shape == (4 * 120, 6 * 120, 4)
  np.testing.assert_array_equal(first, again)
  assert np.abs(first - other).sum(-1).astype(bool).sum() > 100  # the line moved
  assert (first[..., :3].min(-1) < 0.5).sum() > 1000  # ink, not a blank canvas


def test_parallel_coordinates_figure_scales_each_axis_to_its_range(monkeypatch, tmp_path):
  drawn_axes = []
  real_axes = drawing.new_axes
  monkeypatch.setattr(drawing, 'new_axes', lambda: drawn_axes.append(real_axes()) or drawn_axes[-1])
  axes = {'lr': (1e-4, 1e-2, True), 'dropout': (0.0, 0.8, False)}
  rows = [
    {'lr': 1e-3, 'dropout': 0.2, 'loss': 5.0},
    {'lr': 1e-2, 'dropout': 0.8, 'loss': 6.0},
    {'lr': 1e-4, 'dropout': 0.0, 'loss': 5.5},
  ]
  path = drawing.parallel_coordinates_figure(
    axes, rows, 'loss', tmp_path / 'p.png', highlight=[0, 2], best=0
  )
  assert png_size(path)[1] == 4.5 * 120
  ((_, ax),) = drawn_axes
  lines = {
    (line.get_color(), line.get_linewidth()): line.get_ydata()
    for line in ax.get_lines()
    if len(line.get_ydata()) == 3
  }
  # lr 1e-3 is halfway along log10 from -4 to -2; the loss axis spans 5 to 6.
  np.testing.assert_allclose(lines[('darkred', 2.5)], [0.5, 0.25, 0.0])
  np.testing.assert_allclose(lines[('red', 1.2)], [0.0, 0.0, 0.5])
  np.testing.assert_allclose(lines[('0.75', 0.8)], [1.0, 1.0, 1.0])
  with pytest.raises(ConfigError, match='no trials'):
    drawing.parallel_coordinates_figure(axes, [], 'loss', tmp_path / 'p.png')
