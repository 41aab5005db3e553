"""`python launch/meta_train.py` runs `lm-zoo-meta-train` (lm_zoo/cli/meta_train.py);
--help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.meta_train()
