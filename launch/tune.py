"""`python launch/tune.py` runs `lm-zoo-tune` (lm_zoo/cli/tune.py); --help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.tune()
