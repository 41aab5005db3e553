"""`python launch/meta_train.py` runs `lm-zoo-meta-train` (lm_zoo/cli/meta_train.py); --help lists its flags."""

from lm_zoo.cli import meta_train

if __name__ == '__main__':
  meta_train.main()
