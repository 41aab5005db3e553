"""Figures of results, saved as PNG: perplexity against Mogrifier rounds (the
Mogrifier paper's Fig. 3), cross-entropy against sequence length (its reverse
copy task), predictions against truth (the aLSTM paper's tail regression),
the spread of validation perplexity over sampled hyper-parameters (its
robustness study), perplexity over seeds per model (a seed study), training
curves of work directories, the progress of tuning studies, the gain of
dynamic evaluation along a stream and the per-token loss difference of two
models along a text.

Needs matplotlib (`pip install 'lm_zoo[plot]'`). Figures are drawn on
`matplotlib.figure.Figure` objects, never through pyplot, so calling these
functions leaves a notebook's backend and open figures alone. The generic
figures they draw on (`line_figure`, `scatter_figure`) are `lm_zoo.drawing`'s.
"""

from __future__ import annotations

import math
import pathlib
from typing import Mapping, Sequence

import numpy as np

from lm_zoo.drawing import (
  Series,
  line_figure,
  new_axes,
  new_figure,
  save_figure,
  save_labelled,
  scatter_figure,
)
from lm_zoo.errors import ConfigError
from lm_zoo.evaluation.results import perplexity
from lm_zoo.runs.metrics import METRICS_FILE, read_metrics


def mogrifier_ablation_figure(
  valid_perplexity: Mapping[str, float], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """Validation perplexity against rounds r (the paper's Fig. 3).

  `valid_perplexity` maps the variants of `experiments/ptb_mogrifier_ablation.py`
  to perplexities: 'lstm' is r = 0, 'r1'...'r6' the Mogrifier; 'nozigzag' and
  'fullrank' (both r = 5) are drawn as points, 'mlstm' as a reference line.
  """
  rounds = {
    0 if v == 'lstm' else int(v[1:]): ppl
    for v, ppl in valid_perplexity.items()
    if v == 'lstm' or (v[:1] == 'r' and v[1:].isdigit())
  }
  if not rounds:
    raise ConfigError(
      f'no LSTM or rN variant among {sorted(valid_perplexity)}: nothing to draw against rounds'
    )
  xs = sorted(rounds)
  labels = {'nozigzag': 'no zigzag (r = 5)', 'fullrank': 'full rank (r = 5)'}
  points = {labels[v]: (5, valid_perplexity[v]) for v in labels if v in valid_perplexity}
  hlines = {'mLSTM': valid_perplexity['mlstm']} if 'mlstm' in valid_perplexity else {}
  return line_figure(
    {'Mogrifier (r = 0: LSTM)': (xs, [rounds[x] for x in xs])},
    path,
    xlabel='rounds r',
    ylabel='validation perplexity',
    title=title,
    points=points,
    hlines=hlines,
  )


def reverse_copy_figure(
  rows: Sequence[Mapping], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """Cross-entropy against sequence length per model, from the rows that
  `lm_zoo.tasks.run_experiment` returns (keys model, length, cross_entropy)."""
  by_model: dict[str, list[tuple[float, float]]] = {}
  for row in rows:
    by_model.setdefault(row['model'], []).append((row['length'], row['cross_entropy']))
  series = {model: tuple(zip(*sorted(pairs))) for model, pairs in by_model.items()}
  return line_figure(
    series, path, xlabel='sequence length', ylabel='cross-entropy (nats per token)', title=title
  )


def tail_regression_figure(
  rows: Sequence[Mapping], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """Predictions against the truth per model (the aLSTM paper's Fig. 2, left),
  from the rows of `lm_zoo.tasks.run_tail_regression`."""
  series = {
    f'{row["model"]} ({row["num_params"]} params)': (row['y_true'], row['y_pred']) for row in rows
  }
  return scatter_figure(
    series, path, xlabel='y (truth)', ylabel='prediction', title=title, diagonal=True
  )


def robustness_figure(
  rows: Sequence[Mapping], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """The spread of validation perplexity over sampled hyper-parameters per
  model (the aLSTM paper's Fig. 4), from the rows of
  `lm_zoo.tasks.run_robustness`, as empirical distribution functions: the
  fraction of configurations at or below each perplexity. Diverged runs
  (infinite perplexity) never count, so a curve ends below 1 by their share."""
  by_model: dict[str, list[float]] = {}
  for row in rows:
    by_model.setdefault(row['model'], []).append(row['valid_perplexity'])
  series = {}
  for model, values in by_model.items():
    finite = sorted(v for v in values if math.isfinite(v))
    label = f'{model} ({len(values) - len(finite)} of {len(values)} diverged)'
    series[label] = (finite, [(i + 1) / len(values) for i in range(len(finite))])
  return line_figure(
    series,
    path,
    xlabel='validation perplexity',
    ylabel='fraction of sampled configurations',
    title=title,
  )


def seed_study_points(
  rows: Sequence[Mapping], split: str
) -> dict[str, tuple[dict[int, float], float, float]]:
  """Per model, ordered from the worst mean to the best: {seed: perplexity}
  of its converged runs, their mean and sample standard deviation (nan for
  one run), from the rows of `lm_zoo.tasks.run_seed_study`."""
  per_seed: dict[str, dict[int, float]] = {}
  for row in rows:
    value = row[f'{split}_perplexity']
    per_seed.setdefault(row['model'], {})
    if math.isfinite(value):
      per_seed[row['model']][row['seed']] = value
  stats = {}
  for model, values in per_seed.items():
    v = np.array(list(values.values()), dtype=np.float64)
    stats[model] = (
      values,
      float(v.mean()) if len(v) else math.nan,
      float(v.std(ddof=1)) if len(v) > 1 else math.nan,
    )
  return dict(sorted(stats.items(), key=lambda kv: -kv[1][1]))


def seed_study_figure(
  rows: Sequence[Mapping], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """Valid and test perplexity per model over seeds, from the rows of
  `lm_zoo.tasks.run_seed_study`: one point per seed (a colour per seed, so
  that the pairs across models show), the mean with a bar of ± one standard
  deviation."""
  fig = new_figure(10, 4.5)
  seeds = sorted({row['seed'] for row in rows})
  colours = {s: f'C{i % 10}' for i, s in enumerate(seeds)}
  for column, split in enumerate(('valid', 'test')):
    ax = fig.add_subplot(1, 2, column + 1)
    points = seed_study_points(rows, split)
    for x, (values, mean, spread) in enumerate(points.values()):
      for seed, value in values.items():
        ax.plot(
          [x + 0.12],
          [value],
          marker='o',
          markersize=4,
          linestyle='none',
          color=colours[seed],
          label=f'seed {seed}' if x == 0 else None,
        )
      ax.errorbar(
        [x - 0.12],
        [mean],
        yerr=[0.0 if math.isnan(spread) else spread],
        marker='_',
        markersize=12,
        color='black',
        capsize=3,
        label='mean ± std' if x == 0 else None,
      )
    ax.set_xticks(range(len(points)), list(points), rotation=30, ha='right')
    ax.set(ylabel=f'{split} perplexity', title=f'{title} ({split})' if title else split)
    ax.grid(alpha=0.3)
    if column == 0:
      ax.legend(fontsize='small')
  return save_figure(fig, path)


def curves_figure(
  workdirs: Mapping[str, str | pathlib.Path], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """Training and end-of-epoch validation perplexity against step, one pair
  of lines per work directory (read from its metrics.jsonl), and per seed
  for a stack of seeds trained at once (its records carry their `seed`)."""
  series: dict[str, Series] = {}
  for label, workdir in workdirs.items():
    metrics_path = pathlib.Path(workdir) / METRICS_FILE
    if not metrics_path.is_file():
      raise ConfigError(
        f'{metrics_path} not found: is {workdir} a work directory written by lm-zoo-train?'
      )
    records = read_metrics(metrics_path)
    for kind in ('train', 'valid'):
      rows = [r for r in records if r['kind'] == kind and not r.get('final')]
      for seed in dict.fromkeys(r.get('seed') for r in rows):  # None: a run alone
        mine = [r for r in rows if r.get('seed') == seed]
        name = f'{label} {kind}' if seed is None else f'{label} seed {seed} {kind}'
        series[name] = ([r['step'] for r in mine], [perplexity(r['loss']) for r in mine])
  return line_figure(series, path, xlabel='step', ylabel='perplexity', title=title, logy=True)


def tuning_progress_figure(
  studies: Mapping[str, Sequence[Series]], path: str | pathlib.Path, title: str = ''
) -> pathlib.Path:
  """The best valid perplexity so far against trials finished, one line per
  study (`lm_zoo.tuning.best_so_far`) and a colour per name: the studies
  of one name (a model tuned with several sampler seeds) share it, and its
  legend gives the mean and sample standard deviation of their final bests."""
  if not any(len(ys) for group in studies.values() for _, ys in group):
    raise ConfigError('no study has a complete trial: nothing to draw')
  fig, ax = new_axes()
  for colour, (name, group) in enumerate(studies.items()):
    label = _bests_label(name, [ys[-1] for _, ys in group if len(ys)])
    for xs, ys in group:
      # A marker on the best at the end: a study of one trial is one point.
      style = {'color': f'C{colour % 10}', 'marker': 'o', 'markevery': [len(xs) - 1]}
      ax.plot(xs, ys, drawstyle='steps-post', label=label, **style)
      label = None
  return save_labelled(fig, ax, path, 'trials finished', 'best valid perplexity so far', title)


def _bests_label(name: str, bests: Sequence[float]) -> str:
  """`name`, the mean of `bests` and their sample standard deviation."""
  if not bests:
    return f'{name}: no complete trial'
  if len(bests) == 1:
    return f'{name}: best {bests[0]:.1f} (1 study)'
  return f'{name}: best {np.mean(bests):.1f} ± {np.std(bests, ddof=1):.1f} ({len(bests)} studies)'


def binned_loss(
  segment_nll: Sequence[float], segment_tokens: Sequence[float], bin_tokens: int
) -> tuple[list[float], list[float]]:
  """Mean NLL per token over consecutive bins of `bin_tokens` tokens of a
  stream scored segment by segment (a segment falls in the bin of its first
  token): (bin centres in tokens, losses)."""
  nll, tokens = np.asarray(segment_nll, float), np.asarray(segment_tokens, float)
  starts = np.cumsum(tokens) - tokens
  bins = (starts // bin_tokens).astype(int)
  totals, counts = np.bincount(bins, nll), np.bincount(bins, tokens)
  kept = counts > 0
  centres = (np.arange(len(counts)) + 0.5) * bin_tokens
  return centres[kept].tolist(), (totals[kept] / counts[kept]).tolist()


def dyneval_gain_figure(
  runs: Mapping[str, Mapping],
  static: Mapping,
  path: str | pathlib.Path,
  split: str = 'test',
  num_bins: int = 40,
  title: str = '',
) -> pathlib.Path:
  """Perplexity gain of dynamic evaluation along a stream (the meta-learning
  paper's Fig. 2, left): per bin of tokens, static perplexity minus each
  run's, from the JSON of `lm-zoo-eval --output` with a dynamic or learned
  evaluator (`static`: a run with learning rate 0, or any baseline). Runs
  that scored only a prefix of the stream (`max_tokens`) are compared over
  the shortest one."""

  def segments(run):
    if split not in run['segments']:
      raise ConfigError(
        f'a dynamic evaluation result has no {split!r} split: draw one it scored '
        f'({", ".join(run["segments"])})'
      )
    return run['segments'][split]

  length = min(sum(segments(run)['tokens']) for run in (static, *runs.values()))
  # A bin holds at least one whole segment of every run.
  longest = max(max(segments(run)['tokens']) for run in (static, *runs.values()))
  bin_tokens = max(math.ceil(longest), math.ceil(length / num_bins))
  kept = math.ceil(length / bin_tokens)

  def curve(run):
    xs, losses = binned_loss(segments(run)['nll'], segments(run)['tokens'], bin_tokens)
    return xs[:kept], losses[:kept]

  centres, static_loss = curve(static)
  series = {}
  for label, run in runs.items():
    xs, losses = curve(run)
    series[label] = (xs, [perplexity(s) - perplexity(d) for s, d in zip(static_loss, losses)])
  return line_figure(
    series,
    path,
    xlabel=f'position in the {split} stream (tokens)',
    ylabel=f'perplexity gain over static (bins of {bin_tokens:,} tokens)',
    title=title,
    hlines={'no gain': 0.0},
  )


def token_loss_difference_figure(
  losses: Mapping[str, Sequence[float]],
  tokens: Sequence[str],
  path: str | pathlib.Path,
  window: int = 200,
  num_labels: int = 8,
  title: str = '',
) -> pathlib.Path:
  """Where two models differ along a text: the per-token loss of the first
  minus the second's (nats; above 0: the second predicts better), as a
  moving average over `window` tokens, with the `num_labels` tokens of
  largest |difference| written at their position.

  Args:
    losses: two labelled per-token NLL arrays over the same text (from
      `lm_zoo.evaluation.token_losses`).
    tokens: the predicted tokens, one per loss.
  """
  if len(losses) != 2:
    raise ConfigError(f'a loss difference compares two models, got {len(losses)}')
  (label_a, a), (label_b, b) = losses.items()
  a, b = np.asarray(a, float), np.asarray(b, float)
  if not a.shape == b.shape == (len(tokens),):
    raise ConfigError(
      f'the losses ({a.shape}, {b.shape}) and tokens ({len(tokens)}) must cover the same text'
    )
  difference = a - b
  window = max(1, min(window, len(difference)))
  smoothed = np.convolve(difference, np.ones(window) / window, mode='valid')
  fig, ax = new_axes()
  ax.plot(np.arange(len(difference)), difference, color='0.8', linewidth=0.5, label='per token')
  ax.plot(
    np.arange(len(smoothed)) + (window - 1) / 2,
    smoothed,
    linewidth=1.5,
    label=f'mean over {window} tokens ({difference.mean():+.3f} overall)',
  )
  for i in np.argsort(-np.abs(difference))[:num_labels]:
    ax.annotate(tokens[i], (i, difference[i]), fontsize=7, ha='center')
  ax.axhline(0.0, color='black', linewidth=0.5)
  return save_labelled(
    fig, ax, path, 'position in the text (tokens)', f'NLL {label_a} - NLL {label_b} (nats)', title
  )
