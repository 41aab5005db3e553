"""The config a work directory was trained with (its config.json), to train it
again, for example a tuning trial's:

  lm-zoo-train --config=experiments/from_workdir.py:runs/tune/trials/study/trial_0003 \
      --workdir=runs/again
"""

from lm_zoo.runs import load_config


def get_config(workdir: str):
  return load_config(workdir)
