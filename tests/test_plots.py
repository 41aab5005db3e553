"""Figures: what each one draws, and that it is a real PNG of the stated size."""

import json
import math
import struct

import numpy as np
import pytest
from conftest import run_script

from lm_zoo import plots
from lm_zoo.errors import ConfigError
from lm_zoo.runs.metrics import MetricsWriter


def png_size(path):
  data = path.read_bytes()
  assert data[:8] == b'\x89PNG\r\n\x1a\n' and data[12:16] == b'IHDR'
  return struct.unpack('>II', data[16:24])


@pytest.fixture
def drawn(monkeypatch):
  """Records the arguments of line_figure instead of drawing."""
  calls = []
  monkeypatch.setattr(
    plots, 'line_figure', lambda series, path, **kw: calls.append((series, kw)) or path
  )
  return calls


def test_ablation_figure_places_variants_by_rounds(drawn, tmp_path):
  ppl = {'r2': 95.0, 'lstm': 100.0, 'r1': 97.0, 'nozigzag': 96.0, 'fullrank': 94.0, 'mlstm': 99.0}
  plots.mogrifier_ablation_figure(ppl, tmp_path / 'f.png')
  ((series, kw),) = drawn
  assert list(series.values()) == [([0, 1, 2], [100.0, 97.0, 95.0])]
  assert sorted(kw['points'].values()) == [(5, 94.0), (5, 96.0)]
  assert list(kw['hlines'].values()) == [99.0]
  with pytest.raises(ConfigError, match='nothing to draw'):
    plots.mogrifier_ablation_figure({'mlstm': 1.0}, tmp_path / 'f.png')


def test_reverse_copy_figure_groups_by_model_and_sorts_by_length(drawn, tmp_path):
  rows = [
    {'model': m, 'length': n, 'cross_entropy': ce}
    for m, n, ce in (('lstm', 20, 2.0), ('mog', 10, 0.5), ('lstm', 10, 1.0))
  ]
  plots.reverse_copy_figure(rows, tmp_path / 'f.png')
  ((series, _),) = drawn
  assert series == {'lstm': ((10, 20), (1.0, 2.0)), 'mog': ((10,), (0.5,))}


def test_robustness_figure_draws_distribution_functions(drawn, tmp_path):
  rows = [
    {'model': m, 'valid_perplexity': v}
    for m, v in (('lstm', 120.0), ('lstm', math.inf), ('lstm', 110.0), ('alstm', 105.0))
  ]
  plots.robustness_figure(rows, tmp_path / 'f.png')
  ((series, _),) = drawn
  # Fractions of all runs: the diverged LSTM run keeps its curve below 1.
  assert series == {
    'lstm (1 of 3 diverged)': ([110.0, 120.0], [1 / 3, 2 / 3]),
    'alstm (0 of 1 diverged)': ([105.0], [1.0]),
  }


def test_binned_loss_sums_whole_segments_per_bin():
  # Segments of 3, 3, 3, 1 tokens start at 0, 3, 6, 9; bins of 5 tokens.
  centres, losses = plots.binned_loss([3.0, 6.0, 1.5, 2.0], [3, 3, 3, 1], 5)
  assert centres == [2.5, 7.5]
  assert losses == pytest.approx([(3.0 + 6.0) / 6, (1.5 + 2.0) / 4])


def test_dyneval_gain_is_static_minus_dynamic_perplexity(drawn, tmp_path):
  def run(nll, tokens=(2, 2, 2, 2)):
    return {'segments': {'test': {'nll': nll, 'tokens': list(tokens)}}}

  static, dynamic = run([2.0, 2.0, 4.0, 4.0]), run([2.0, 1.0, 2.0, 2.0])
  plots.dyneval_gain_figure({'rms': dynamic}, static, tmp_path / 'f.png', num_bins=2)
  ((series, _),) = drawn
  xs, gains = series['rms']
  assert xs == [2.0, 6.0]
  assert gains == pytest.approx([math.e - math.exp(0.75), math.e**2 - math.e])
  # A run of the first 4 tokens only: compared over those, in bins of 2.
  plots.dyneval_gain_figure(
    {'prefix': run([1.0, 1.0], [2, 2])}, static, tmp_path / 'f.png', num_bins=2
  )
  assert drawn[-1][0]['prefix'] == ([1.0, 3.0], pytest.approx([math.e - math.e**0.5] * 2))
  # Longer segments than the bins asked for: a bin grows to hold a whole one.
  plots.dyneval_gain_figure(
    {'long': run([4.0, 4.0], [4, 4])}, static, tmp_path / 'f.png', num_bins=4
  )
  assert drawn[-1][0]['long'] == ([2.0, 6.0], pytest.approx([0.0, math.e**2 - math.e]))
  # A static loss past the float range: an infinite gain, not an OverflowError.
  plots.dyneval_gain_figure({'rms': dynamic}, run([2000.0] * 4), tmp_path / 'f.png', num_bins=2)
  assert drawn[-1][0]['rms'][1] == [math.inf, math.inf]


def test_curves_figure_reads_metrics(drawn, tmp_path):
  writer = MetricsWriter(tmp_path)
  writer.write('train', step=10, loss=2.0)
  writer.write('valid', step=10, epoch=1, loss=3.0)
  writer.write('valid', step=10, final=True, loss=9.0)  # the final evaluation: left out
  plots.curves_figure({'run': tmp_path}, tmp_path / 'f.png')
  ((series, kw),) = drawn
  assert series == {'run train': ([10], [math.exp(2.0)]), 'run valid': ([10], [math.exp(3.0)])}
  assert kw['logy']
  with pytest.raises(ConfigError, match='not found'):
    plots.curves_figure({'x': tmp_path / 'missing'}, tmp_path / 'f.png')


def test_curves_figure_draws_each_seed_of_a_stack(drawn, tmp_path):
  writer = MetricsWriter(tmp_path)
  for seed, loss in ((3, 2.0), (4, 2.5)):
    writer.write('train', step=10, epoch=1, seed=seed, loss=loss)
  for seed, loss in ((3, 3.0), (4, 3.5)):
    writer.write('valid', step=10, epoch=1, seed=seed, loss=loss)
  plots.curves_figure({'stack': tmp_path}, tmp_path / 'f.png')
  ((series, _),) = drawn
  assert series == {
    'stack seed 3 train': ([10], [math.exp(2.0)]),
    'stack seed 4 train': ([10], [math.exp(2.5)]),
    'stack seed 3 valid': ([10], [math.exp(3.0)]),
    'stack seed 4 valid': ([10], [math.exp(3.5)]),
  }


def test_plot_script_draws_ablation_from_summaries(tmp_path):
  for variant, ppl in (('lstm', 120.0), ('r5', 110.0), ('mlstm', 118.0)):
    (tmp_path / f'abl_{variant}').mkdir()
    (tmp_path / f'abl_{variant}' / 'summary.json').write_text(
      json.dumps({'valid': {'perplexity': ppl}})
    )
  out = tmp_path / 'ablation.png'
  done = run_script(
    [
      'launch/plot.py',
      '--figure=mogrifier_ablation',
      f'--workdir_prefix={tmp_path}/abl_',
      f'--output={out}',
    ]
  )
  assert done.returncode == 0, done.stderr
  assert png_size(out) == (720, 480)
  missing = run_script(
    [
      'launch/plot.py',
      '--figure=reverse_copy',
      f'--results={tmp_path}/none.json',
      f'--output={out}',
    ]
  )
  assert missing.returncode != 0 and 'error:' in missing.stderr
  assert 'Traceback' not in missing.stderr


def test_token_loss_difference_figure(tmp_path):
  a = np.full(300, 5.0)
  b = a - np.linspace(0, 1, 300)  # the second model gains along the text
  path = plots.token_loss_difference_figure(
    {'lstm': a, 'mogrifier': b}, ['w'] * 300, tmp_path / 'd.png', window=50
  )
  assert png_size(path) == (6 * 120, 4 * 120)
  with pytest.raises(ConfigError, match='same text'):
    plots.token_loss_difference_figure({'a': a, 'b': b[:10]}, ['w'] * 300, tmp_path / 'e.png')
  with pytest.raises(ConfigError, match='compares two models'):
    plots.token_loss_difference_figure({'a': a}, ['w'] * 300, tmp_path / 'e.png')


def test_seed_study_figure_orders_models_and_leaves_diverged_runs_out(tmp_path):
  rows = [
    {'model': m, 'seed': s, 'valid_perplexity': v, 'test_perplexity': v - 5}
    for m, s, v in (
      ('lstm', 0, 160.0),
      ('lstm', 1, 164.0),
      ('mog', 0, 150.0),
      ('mog', 1, math.inf),
      ('mlstm', 0, 170.0),
      ('mlstm', 1, 172.0),
    )
  ]
  points = plots.seed_study_points(rows, 'test')
  assert list(points) == ['mlstm', 'lstm', 'mog']  # worst mean first
  assert points['lstm'] == ({0: 155.0, 1: 159.0}, 157.0, pytest.approx(2 * math.sqrt(2)))
  values, mean, spread = points['mog']
  assert values == {0: 145.0} and mean == 145.0 and math.isnan(spread)
  assert png_size(plots.seed_study_figure(rows, tmp_path / 'f.png', 'PTB')) == (1200, 540)


def test_tuning_progress_figure_colours_by_study_name_with_the_mean_of_bests(monkeypatch, tmp_path):
  drawn = []
  monkeypatch.setattr(plots, 'save_labelled', lambda fig, ax, path, *a: drawn.append(ax) or path)
  studies = {
    'lstm': [([1, 2, 3], [500.0, 420.0, 400.0]), ([2, 3], [450.0, 380.0])],
    'mogrifier': [([1, 2], [390.0, 350.0])],
  }
  plots.tuning_progress_figure(studies, tmp_path / 'f.png')
  (ax,) = drawn
  colours = [line.get_color() for line in ax.get_lines()]
  assert colours[0] == colours[1] != colours[2]
  assert ax.get_legend_handles_labels()[1] == [
    f'lstm: best 390.0 ± {np.std([400.0, 380.0], ddof=1):.1f} (2 studies)',
    'mogrifier: best 350.0 (1 study)',
  ]
  with pytest.raises(ConfigError, match='nothing to draw'):
    plots.tuning_progress_figure({'lstm': [([], [])]}, tmp_path / 'f.png')


def test_plot_script_draws_the_progress_of_tuning_workdirs(tmp_path):
  import optuna

  workdirs = []
  for name, losses in (('lstm', (6.0, 5.5)), ('lstm', (5.8,)), ('mogrifier', (5.7, 5.9))):
    workdirs.append(tmp_path / f'{name}_{len(workdirs)}')
    workdirs[-1].mkdir()
    study = optuna.create_study(study_name=name, storage=f'sqlite:///{workdirs[-1]}/study.db')
    for loss in losses:
      study.add_trial(optuna.create_trial(value=loss))
  out = tmp_path / 'progress.png'
  flags = ['launch/plot.py', '--figure=tuning_progress', f'--output={out}']
  done = run_script([*flags, f'--workdirs={",".join(map(str, workdirs))}'])
  assert done.returncode == 0, done.stderr
  assert png_size(out) == (720, 480)
  missing = run_script([*flags, f'--workdirs={tmp_path}'])
  assert missing.returncode != 0 and 'study.db not found' in missing.stderr
  assert 'Traceback' not in missing.stderr
