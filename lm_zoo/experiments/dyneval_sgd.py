"""Dynamic evaluation by SGD (Krause et al. 2018, section 5):

  lm-zoo-eval --workdir=W --config=experiments/dyneval_sgd.py \
      --config.dynamic.learning_rate=0.01,0.1 --config.dynamic.search_tokens=5000

Several values in a tuple are searched on valid (its first search_tokens
tokens); the best setting then scores every split from the trained weights.
"""

from lm_zoo.configs import evaluation_config


def get_config():
  c = evaluation_config('dynamic')
  c.dynamic.update(rule='sgd', learning_rate=(1e-2, 3e-2, 1e-1), decay=(0.0,), segment_length=(5,))
  return c
