"""`python launch/download.py` runs `lm-zoo-download` (lm_zoo/cli/download.py);
--help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.download()
