"""The small-scale comparisons over several seeds:
every model on `lm_zoo.experiments.recipes.small_ptb_config()` (3M parameters, hidden
size solved for the budget, 2 epochs), trained once per seed and compared
with the LSTM over the same seeds (`lm_zoo.tasks.seeds`).

  lstm            the plain LSTM (ptb_mogrifier_ablation.py:lstm)
  mogrifier_r2    Mogrifier, 2 rounds, rank 40 (ptb_mogrifier_ablation.py:r2)
  mogrifier_r5    Mogrifier, 5 rounds, rank 40 (ptb_mogrifier_ablation.py:r5)
  mlstm           multiplicative LSTM (ptb_mogrifier_ablation.py:mlstm)
  alstm           aLSTM, LSTM adaptation model of size 100 (ptb_alstm_small.py:recurrent)
  lstm_dual       the LSTM with the dual connection (dual.py:lstm_dual)
  mogrifier_lamb  mogrifier_r5 with lamb's recipe features: capped input
                  gate, skip connections, state dropped with probability 0.01
  lstm_mos        the LSTM with a mixture of 2 tied softmaxes (Yang et al.
                  2018), latent dropout 0.4, the output's, as lamb's tuned
                  MoS models have both (`lamb_config`). Yang et al. use 15;
                  at this size a component costs more than the rest of
                  the step.

Variant `mos` (`--config=experiments/seed_study.py:mos`) trains `lstm` and
`lstm_mos` alone (the main study's runs when both share `workdir`).

Variant `lamb_features` (`--config=experiments/seed_study.py:lamb_features`)
takes them one at a time against mogrifier_r5: `r5_cap_input_gate`,
`r5_skip_connections`, `r5_drop_state`, beside `mogrifier_r5` and
`mogrifier_lamb` (the same runs as the main study's when both share
`workdir`).

Each run is in its own work directory `{workdir}/{model}_s{seed}`: re-running
the command resumes the study, and the same command on other cores or hosts
adds workers to it. On a GPU, `--config.stack=True` trains each model's
seeds at once (`lm-zoo-train --seeds`), in `{workdir}/{model}_s0-2`: faster
per seed where a model's kernels leave the GPU idle, slower on a CPU
(docs/usage.md, "Several seeds at once on one accelerator").

  taskset -c 1 lm-zoo-task \
      --config=experiments/seed_study.py --config.workdir=/work/runs/seeds \
      --output=/work/runs/seeds.json
"""

import pathlib
import runpy

import ml_collections

# The single-run configs in the sibling files (experiments/ is not a package).
_HERE = pathlib.Path(__file__).parent
ablation = runpy.run_path(str(_HERE / 'ptb_mogrifier_ablation.py'))['get_config']
alstm_small = runpy.run_path(str(_HERE / 'ptb_alstm_small.py'))['get_config']
dual = runpy.run_path(str(_HERE / 'dual.py'))['get_config']


VARIANTS = ('models', 'mos', 'lamb_features')


def _with(
  c: ml_collections.ConfigDict,
  cap_input_gate: bool = False,
  skip_connections: bool = False,
  drop_state: float = 0.0,
) -> ml_collections.ConfigDict:
  c.model.update(cap_input_gate=cap_input_gate, skip_connections=skip_connections)
  c.train.drop_state = drop_state
  return c


def _mixture(c: ml_collections.ConfigDict, components: int) -> ml_collections.ConfigDict:
  c.model.head = 'mos'
  c.model.mos.update(components=components, dropout_latent=c.model.dropout_output)
  return c


def get_config(variant: str = 'models'):
  if variant not in VARIANTS:
    raise ValueError(f'variant must be one of {", ".join(VARIANTS)}, got {variant!r}')
  c = ml_collections.ConfigDict()
  c.task = 'seeds'
  lamb = _with(ablation('r5'), cap_input_gate=True, skip_connections=True, drop_state=0.01)
  mos = _mixture(ablation('lstm'), components=2)
  if variant == 'models':
    models = {
      'lstm': ablation('lstm'),
      'mogrifier_r2': ablation('r2'),
      'mogrifier_r5': ablation('r5'),
      'mlstm': ablation('mlstm'),
      'alstm': alstm_small('recurrent'),
      'lstm_dual': dual('lstm_dual'),
      'mogrifier_lamb': lamb,
      'lstm_mos': mos,
    }
    c.reference = 'lstm'
  elif variant == 'mos':
    models = {'lstm': ablation('lstm'), 'lstm_mos': mos}
    c.reference = 'lstm'
  else:
    models = {
      'mogrifier_r5': ablation('r5'),
      'r5_cap_input_gate': _with(ablation('r5'), cap_input_gate=True),
      'r5_skip_connections': _with(ablation('r5'), skip_connections=True),
      'r5_drop_state': _with(ablation('r5'), drop_state=0.01),
      'mogrifier_lamb': lamb,
    }
    c.reference = 'mogrifier_r5'
  for model in models.values():
    model.generate.num_lines = 0
  c.models = ml_collections.ConfigDict(models)
  c.seeds = (0, 1, 2)
  c.stack = False  # True: each model's seeds trained at once (lm_zoo.tasks.seeds)
  c.workdir = 'runs/seeds'
  return c
