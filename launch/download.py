"""`python launch/download.py` runs `lm-zoo-download` (lm_zoo/cli/download.py); --help lists its flags."""

from lm_zoo.cli import download

if __name__ == '__main__':
  download.main()
