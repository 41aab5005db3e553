"""Runs `lm-zoo-tune` with the arguments after N, killing itself with SIGKILL
inside its N-th checkpoint write: the arrays are in orbax's temporary
folder, not yet committed (StandardCheckpointHandler.finalize is next).

  python tests/kill_in_checkpoint.py N --tune=... --workdir=...
"""

import os
import signal
import sys

import orbax.checkpoint as ocp

from lm_zoo.programs import tune


def main() -> None:
  kill_at, sys.argv[1:] = int(sys.argv[1]), sys.argv[2:]
  finalize, calls = ocp.StandardCheckpointHandler.finalize, []

  def killed_at_the_nth(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == kill_at:
      os.kill(os.getpid(), signal.SIGKILL)
    return finalize(self, *args, **kwargs)

  ocp.StandardCheckpointHandler.finalize = killed_at_the_nth
  tune()


if __name__ == '__main__':
  main()
