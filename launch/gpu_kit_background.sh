#!/usr/bin/env bash
# The GPU run kit (launch/gpu_run_kit.sh) in the background, for a host lent in
# calls shorter than the kit: the first call copies the checkout into RUN/src
# and starts the kit from there in a process session of its own (setsid),
# which outlives the call; every call then waits up to SECONDS for the kit to
# finish, packing what it has written so far into PACK every PACK_EVERY
# seconds (default 60), when the wait ends, and when the call is stopped
# (TERM or INT), as the few files such a host sends back:
#
#   launch/gpu_kit_background.sh SECONDS PACK [RUN]
#
#   status.txt           running, or the kit's exit code; the log's last lines
#   kit.log              the kit's output
#   figures.tar.gz       RUN's files but the profiles, the optimized HLO, the
#                        copied checkout and the work directories' weights
#                        (checkpoints/, best/)
#   hlo.tar.gz           RUN's hlo_*/ folders
#   profiles.tar.gz.NN   RUN's profile*/ folders, in pieces of 15 MiB (at most
#                        MAX_PIECES, default 3: `cat profiles.tar.gz.* | tar xz`)
#
# A call cut short by its host's time limit thus still returns the last pack.
# RUN is the kit's OUT (default /tmp/lm_zoo_gpu_kit), outside the checkout
# that each call may copy again (the kit runs from its own copy, so a later
# call's copy does not change the files under it). The first call's
# environment configures the kit (KIT_PARTS, AGREEMENT_RUNS, MINUTES, ...: see
# gpu_run_kit.sh) and is recorded in RUN/kit.env; later calls only wait and
# pack. KIT names another script to run (default the copied kit).
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: launch/gpu_kit_background.sh SECONDS PACK [RUN]: SECONDS to wait, a whole number" >&2
  exit 2
fi
SECONDS_TO_WAIT=$1
mkdir -p "$2" "${3:-/tmp/lm_zoo_gpu_kit}"
PACK=$(cd "$2" && pwd)
RUN=$(cd "${3:-/tmp/lm_zoo_gpu_kit}" && pwd)
MAX_PIECES=${MAX_PIECES:-3}
PACK_EVERY=${PACK_EVERY:-60}
if [ -n "${KIT:-}" ]; then
  KIT=$(realpath "$KIT")
fi
cd "$(dirname "$0")/.."
# tar of files the kit may still be writing: such a file is packed as it was
pack() { tar --warning=no-file-changed "$@" || [ $? -eq 1 ]; }

# Each file is written under a temporary name, then renamed: a call stopped
# while packing returns the pack before.
pack_all() {
  local new="$PACK/.packing" pieces
  rm -rf "$new" && mkdir -p "$new"
  {
    if [ -e "$RUN/exit_code" ]; then
      echo "finished: exit code $(cat "$RUN/exit_code")"
    else
      echo "running"
    fi
    echo "--- the log's last lines"
    tail -n 40 "$RUN/kit.log" 2>/dev/null || true
  } > "$new/status.txt"
  cp "$RUN/kit.log" "$new/kit.log" 2>/dev/null || true
  (cd "$RUN" && pack -czf "$new/figures.tar.gz" --exclude='./hlo_*' --exclude='./profile*' \
      --exclude=./src --exclude=checkpoints --exclude=best --exclude=./kit.log .)
  if compgen -G "$RUN/hlo_*" > /dev/null; then
    (cd "$RUN" && pack -czf "$new/hlo.tar.gz" hlo_*)
  fi
  if compgen -G "$RUN/profile*" > /dev/null; then
    (cd "$RUN" && pack -cz profile*) | split -b 15M -d -a 2 - "$new/profiles.tar.gz."
    pieces=("$new"/profiles.tar.gz.*)
    if [ ${#pieces[@]} -gt "$MAX_PIECES" ]; then
      rm -f "${pieces[@]:$MAX_PIECES}"
      echo "profiles: ${#pieces[@]} pieces, only the first $MAX_PIECES kept" >> "$new/status.txt"
    fi
  fi
  rm -f "$PACK"/profiles.tar.gz.*
  mv -f "$new"/* "$PACK"/
  rmdir "$new"
}

if [ ! -e "$RUN/kit.env" ]; then
  env | grep -E '^(KIT_|AGREEMENT_|MINUTES=|SEEDS_|TRAIN_CONFIG=|WHEELS=|LM_ZOO_DATA=)' \
      > "$RUN/kit.env" || true
  mkdir -p "$RUN/src"
  tar --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./runs -cf - . \
      | tar -C "$RUN/src" -xf -
  KIT=${KIT:-$RUN/src/launch/gpu_run_kit.sh}
  # stdin from /dev/null and a session of its own: the call's end does not stop it
  # setsid(1), or where util-linux is missing Python's os.setsid
  detach=(setsid)
  command -v setsid >/dev/null || detach=(python3 -c \
      'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])')
  "${detach[@]}" bash -c 'bash "$1" "$2" > "$2/kit.log" 2>&1; echo $? > "$2/exit_code"' \
      kit "$KIT" "$RUN" < /dev/null > /dev/null 2>&1 &
  echo "started $KIT into $RUN"
fi

trap 'pack_all; cat "$PACK/status.txt"; exit 143' TERM INT
deadline=$((SECONDS + SECONDS_TO_WAIT))
packed=$SECONDS
while [ ! -e "$RUN/exit_code" ] && [ $SECONDS -lt $deadline ]; do
  sleep 2 & wait $!  # a TERM is taken at once, not after the sleep
  if [ $((SECONDS - packed)) -ge "$PACK_EVERY" ]; then
    pack_all
    packed=$SECONDS
  fi
done
pack_all
cat "$PACK/status.txt"
