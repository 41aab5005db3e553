"""`python launch/train.py` runs `lm-zoo-train` (lm_zoo/cli/train.py); --help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.train()
