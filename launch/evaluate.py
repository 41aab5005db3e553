"""`python launch/evaluate.py` runs `lm-zoo-eval` (lm_zoo/cli/evaluate.py); --help lists its flags."""

from lm_zoo.cli import evaluate

if __name__ == '__main__':
  evaluate.main()
