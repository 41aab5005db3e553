"""`python launch/run_task.py` runs `lm-zoo-task` (lm_zoo/cli/task.py); --help lists its flags."""

from lm_zoo import programs

if __name__ == '__main__':
  programs.task()
