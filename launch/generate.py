"""`python launch/generate.py` runs `lm-zoo-generate` (lm_zoo/cli/generate.py);
--help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.generate()
