"""`python launch/export.py` runs `lm-zoo-export` (lm_zoo/cli/export.py);
--help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.export()
