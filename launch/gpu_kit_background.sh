#!/usr/bin/env bash
# The GPU run kit (launch/gpu_run_kit.sh) in the background, for a host lent in
# calls shorter than the kit: the first call starts the kit in a process
# session of its own (setsid), which outlives the call; every call then waits
# up to SECONDS for the kit to finish and packs what it has written so far
# into PACK, as the few files such a host sends back:
#
#   launch/gpu_kit_background.sh SECONDS PACK [RUN]
#
#   status.txt           running, or the kit's exit code; the log's last lines
#   kit.log              the kit's output
#   figures.tar.gz       RUN's files but the profiles, the optimized HLO and
#                        the work directories' weights (checkpoints/, best/)
#   hlo.tar.gz           RUN's hlo_*/ folders
#   profiles.tar.gz.NN   RUN's profile*/ folders, in pieces of 15 MiB (at most
#                        MAX_PIECES, default 3: `cat profiles.tar.gz.* | tar xz`)
#
# RUN is the kit's OUT (default /tmp/lm_zoo_gpu_kit), outside the checkout
# that each call may copy again. The first call's environment configures the
# kit (KIT_PARTS, AGREEMENT_RUNS, MINUTES, ...: see gpu_run_kit.sh) and is
# recorded in RUN/kit.env; later calls only wait and pack. KIT names another
# script to run (default the kit).
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: launch/gpu_kit_background.sh SECONDS PACK [RUN]: SECONDS to wait, a whole number" >&2
  exit 2
fi
SECONDS_TO_WAIT=$1
mkdir -p "$2" "${3:-/tmp/lm_zoo_gpu_kit}"
PACK=$(cd "$2" && pwd)
RUN=$(cd "${3:-/tmp/lm_zoo_gpu_kit}" && pwd)
KIT=$(realpath "${KIT:-$(dirname "$0")/gpu_run_kit.sh}")
MAX_PIECES=${MAX_PIECES:-3}
cd "$(dirname "$0")/.."
# tar of files the kit may still be writing: such a file is packed as it was
pack() { tar --warning=no-file-changed "$@" || [ $? -eq 1 ]; }

if [ ! -e "$RUN/kit.env" ]; then
  env | grep -E '^(KIT_|AGREEMENT_|MINUTES=|SEEDS_|TRAIN_CONFIG=|WHEELS=|LM_ZOO_DATA=)' \
      > "$RUN/kit.env" || true
  # stdin from /dev/null and a session of its own: the call's end does not stop it
  # setsid(1), or where util-linux is missing Python's os.setsid
  detach=(setsid)
  command -v setsid >/dev/null || detach=(python3 -c \
      'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])')
  "${detach[@]}" bash -c 'bash "$1" "$2" > "$2/kit.log" 2>&1; echo $? > "$2/exit_code"' \
      kit "$KIT" "$RUN" < /dev/null > /dev/null 2>&1 &
  echo "started $KIT into $RUN"
fi

deadline=$((SECONDS + SECONDS_TO_WAIT))
while [ ! -e "$RUN/exit_code" ] && [ $SECONDS -lt $deadline ]; do
  sleep 2
done

{
  if [ -e "$RUN/exit_code" ]; then
    echo "finished: exit code $(cat "$RUN/exit_code")"
  else
    echo "running"
  fi
  echo "--- the log's last lines"
  tail -n 40 "$RUN/kit.log" 2>/dev/null || true
} > "$PACK/status.txt"
cp "$RUN/kit.log" "$PACK/kit.log" 2>/dev/null || true
(cd "$RUN" && pack -czf "$PACK/figures.tar.gz" --exclude='./hlo_*' --exclude='./profile*' \
    --exclude=checkpoints --exclude=best --exclude=./kit.log .)
shopt -s nullglob
hlo=("$RUN"/hlo_*)
if [ ${#hlo[@]} -gt 0 ]; then
  (cd "$RUN" && pack -czf "$PACK/hlo.tar.gz" hlo_*)
fi
profiles=("$RUN"/profile*)
if [ ${#profiles[@]} -gt 0 ]; then
  (cd "$RUN" && pack -cz profile*) | split -b 15M -d -a 2 - "$PACK/profiles.tar.gz."
  pieces=("$PACK"/profiles.tar.gz.*)
  if [ ${#pieces[@]} -gt "$MAX_PIECES" ]; then
    rm -f "${pieces[@]:$MAX_PIECES}"
    echo "profiles: ${#pieces[@]} pieces, only the first $MAX_PIECES kept" >> "$PACK/status.txt"
  fi
fi
cat "$PACK/status.txt"
