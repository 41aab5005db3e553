"""`python launch/plot.py` runs `lm-zoo-plot` (lm_zoo/cli/plot.py); --help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.plot()
