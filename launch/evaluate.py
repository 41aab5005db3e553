"""`python launch/evaluate.py` runs `lm-zoo-eval` (lm_zoo/cli/evaluate.py);
--help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.evaluate()
