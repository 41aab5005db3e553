"""What the figures of `lm_zoo.plots` are drawn with: a matplotlib figure
made without pyplot, saved as a PNG, and the generic kinds of figure:
labelled lines, point clouds, and rows of values on parallel coordinates
(the tuning report's figure).

Needs matplotlib (`pip install 'lm_zoo[plot]'`), imported on first use.
"""

from __future__ import annotations

import pathlib
from typing import Mapping, Sequence

import numpy as np

from lm_zoo.errors import ConfigError

Series = tuple[Sequence[float], Sequence[float]]


def new_figure(width: float = 6, height: float = 4):
  """A new `matplotlib.figure.Figure`, never pyplot's, so that drawing leaves
  a notebook's backend and open figures alone."""
  try:
    from matplotlib.figure import Figure
  except ImportError as e:
    raise ConfigError("plots need matplotlib: pip install 'lm_zoo[plot]'") from e
  return Figure(figsize=(width, height), dpi=120, layout='constrained')


def new_axes():
  """A new figure and its one axes."""
  fig = new_figure()
  return fig, fig.add_subplot()


def save_figure(fig, path: str | pathlib.Path) -> pathlib.Path:
  """Saves `fig` as a PNG at `path` (its folder made if missing); returns it."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path)
  return path


def save_labelled(
  fig, ax, path: str | pathlib.Path, xlabel: str, ylabel: str, title: str
) -> pathlib.Path:
  """Labels the one axes of `fig`, with a grid and a legend, and saves it."""
  ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
  ax.grid(alpha=0.3)
  ax.legend()
  return save_figure(fig, path)


def line_figure(
  series: Mapping[str, Series],
  path: str | pathlib.Path,
  *,
  xlabel: str,
  ylabel: str,
  title: str = '',
  points: Mapping[str, tuple[float, float]] | None = None,
  hlines: Mapping[str, float] | None = None,
  logy: bool = False,
) -> pathlib.Path:
  """Draws labelled lines (xs, ys), single labelled points and horizontal
  reference lines on one axis; saves a PNG at `path` and returns it."""
  fig, ax = new_axes()
  for label, (xs, ys) in series.items():
    ax.plot(xs, ys, marker='o', markersize=4, label=label)
  for marker, (label, (x, y)) in zip('s^vDP*X', (points or {}).items()):
    ax.plot([x], [y], marker=marker, linestyle='none', markersize=7, label=label)
  for style, (label, y) in zip(('--', ':', '-.'), (hlines or {}).items()):
    ax.axhline(y, linestyle=style, color='gray', label=label)
  if logy:
    from matplotlib import ticker

    ax.set_yscale('log')
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
  return save_labelled(fig, ax, path, xlabel, ylabel, title)


def scatter_figure(
  series: Mapping[str, Series],
  path: str | pathlib.Path,
  *,
  xlabel: str,
  ylabel: str,
  title: str = '',
  diagonal: bool = False,
) -> pathlib.Path:
  """Labelled point clouds (xs, ys), with the line y = x when `diagonal`."""
  fig, ax = new_axes()
  for label, (xs, ys) in series.items():
    ax.scatter(xs, ys, s=4, alpha=0.5, label=label)
  if diagonal:
    low = min(min(min(xs), min(ys)) for xs, ys in series.values())
    high = max(max(max(xs), max(ys)) for xs, ys in series.values())
    ax.plot([low, high], [low, high], color='black', linewidth=1, label='y = x')
  return save_labelled(fig, ax, path, xlabel, ylabel, title)


def _scaled_to_ranges(
  values: np.ndarray, ranges: Sequence[tuple[float, float, bool]]
) -> np.ndarray:
  """Each column of `values` placed in its (low, high, log scale) range: 0 at
  low, 1 at high (0.5 for a range of one value)."""
  scaled = np.empty_like(values)
  for j, (low, high, log) in enumerate(ranges):
    column = values[:, j]
    if log:
      low, high, column = np.log(low), np.log(high), np.log(column)
    scaled[:, j] = 0.5 if high == low else (column - low) / (high - low)
  return scaled


def _trial_styles(count: int, highlight: Sequence[int], best: int | None) -> list[tuple[int, dict]]:
  """(trial, its line's style) in drawing order: the others in grey, then the
  highlighted ones in red, then the best, thickest, on top."""
  order = (
    [i for i in range(count) if i not in highlight]
    + [i for i in highlight if i != best]
    + ([best] if best is not None else [])
  )

  def style(i):
    if i == best:
      return {'color': 'darkred', 'linewidth': 2.5, 'zorder': 3}
    if i in highlight:
      return {'color': 'red', 'linewidth': 1.2, 'alpha': 0.8, 'zorder': 2}
    return {'color': '0.75', 'linewidth': 0.8, 'zorder': 1}

  return [(i, style(i)) for i in order]


def _draw_coordinate_axes(ax, labels: Sequence[str], ranges) -> None:
  """One vertical axis per label, its range's ends written at its foot and top."""
  xs = np.arange(len(ranges))
  for x, (low, high, _) in zip(xs, ranges):
    ax.axvline(x, color='black', linewidth=0.6)
    for y, value in ((0.0, low), (1.0, high)):
      ax.annotate(
        f'{value:.3g}',
        (x, y),
        xytext=(0, -9 if y == 0 else 3),
        textcoords='offset points',
        fontsize=7,
        ha='center',
      )
  ax.set_xticks(xs, labels, rotation=30, ha='right', fontsize=8)
  ax.set_yticks([])
  ax.set_ylim(-0.12, 1.25)


def parallel_coordinates_figure(
  axes: Mapping[str, tuple[float, float, bool]],
  rows: Sequence[Mapping[str, float]],
  objective: str,
  path: str | pathlib.Path,
  *,
  highlight: Sequence[int] = (),
  best: int | None = None,
  title: str = '',
) -> pathlib.Path:
  """Tuning trials on parallel coordinates (the Mogrifier paper's Figs. 5
  and 6): one vertical axis per hyper-parameter, spanning its tuning range,
  and a last one for the `objective`; one line per trial. Trials at the
  indices `highlight` (the best one's neighbourhood) are drawn in red over
  the others in grey, `best` thickest.

  Args:
    axes: hyper-parameter -> (low, high, log scale) of its tuning range.
    rows: each trial's values, the hyper-parameters' and the objective's.
  """
  if not rows:
    raise ConfigError('no trials to draw')
  names = list(axes)
  values = np.array([[row[n] for n in names] + [row[objective]] for row in rows], float)
  finite = values[np.isfinite(values[:, -1]), -1]
  ranges = [axes[n] for n in names]
  ranges.append((finite.min(), finite.max(), False) if finite.size else (0.0, 1.0, False))
  scaled = _scaled_to_ranges(values, ranges)
  fig, ax = new_axes()
  fig.set_size_inches(max(6.0, 1.1 * len(ranges)), 4.5)
  for i, style in _trial_styles(len(rows), highlight, best):
    ax.plot(np.arange(len(ranges)), np.clip(scaled[i], -0.05, 1.05), **style)
  _draw_coordinate_axes(ax, [*names, objective], ranges)
  ax.set_title(title)
  ax.plot([], [], color='darkred', linewidth=2.5, label='best')
  others = len([i for i in highlight if i != best])
  ax.plot([], [], color='red', label=f'its neighbourhood ({others} other trials)')
  ax.plot([], [], color='0.75', label='other trials')
  ax.legend(fontsize=7, loc='upper center', ncol=3)
  return save_figure(fig, path)
