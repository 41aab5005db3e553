#!/usr/bin/env bash
# The GPU run kit (launch/gpu_run_kit.sh) in the background, for a host lent in
# calls shorter than the kit: the first call copies the checkout into RUN/src
# and starts the kit from there in a process session of its own (setsid),
# which outlives the call; every call then waits up to SECONDS for the kit to
# finish, packing what it has written so far into PACK every PACK_EVERY
# seconds (default 60; the profiles only at the end), when the wait ends, and
# when the call is stopped (TERM or INT), as the few files such a host sends
# back:
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
# call's copy does not change the files under it; LM_ZOO_DATA, WHEELS and
# PYTHON are made absolute first, and LM_ZOO_DATA defaults to shared/data
# beside the checkout where it is there). The first call's
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
# The kit runs from its copy of the checkout: the paths it is given must not
# depend on the folder it runs in (relative ones are the caller's).
for name in LM_ZOO_DATA WHEELS PYTHON; do
  if [ -n "${!name:-}" ] && [[ ${!name} == */* ]] && [[ ${!name} != /* ]]; then
    export "$name=$(realpath -m "${!name}")"
  fi
done
cd "$(dirname "$0")/.."
# tar of files the kit may still be writing: such a file is packed as it was
pack() { tar --warning=no-file-changed "$@" || [ $? -eq 1 ]; }

# The pack is made in RUN/.packing, then each file is copied into PACK under a
# hidden name and renamed, status.txt first: a call stopped at any moment
# returns whole files, at most one of them from the pack before. The
# profiles (large, and their tar's CPU would overlap the timings) are packed
# only when the wait ends or the call is stopped: PROFILES=1.
pack_all() {
  local new="$RUN/.packing" pieces name
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
      --exclude=./src --exclude=./.packing --exclude=checkpoints --exclude=best \
      --exclude=./kit.log .)
  if compgen -G "$RUN/hlo_*" > /dev/null; then
    (cd "$RUN" && pack -czf "$new/hlo.tar.gz" hlo_*)
  fi
  if [ "${1:-}" = PROFILES=1 ] && compgen -G "$RUN/profile*" > /dev/null; then
    (cd "$RUN" && pack -cz profile*) | split -b 15M -d -a 2 - "$new/profiles.tar.gz."
    pieces=("$new"/profiles.tar.gz.*)
    if [ ${#pieces[@]} -gt "$MAX_PIECES" ]; then
      rm -f "${pieces[@]:$MAX_PIECES}"
      echo "profiles: ${#pieces[@]} pieces, only the first $MAX_PIECES kept" >> "$new/status.txt"
    fi
    for name in "$PACK"/profiles.tar.gz.*; do  # a piece the new pack does not have
      [ -e "$new/${name##*/}" ] || rm -f "$name"
    done
  fi
  for name in status.txt kit.log figures.tar.gz hlo.tar.gz "$new"/profiles.tar.gz.*; do
    name=${name##*/}
    if [ -e "$new/$name" ]; then
      cp "$new/$name" "$PACK/.$name.tmp" && mv -f "$PACK/.$name.tmp" "$PACK/$name"
    fi
  done
  rm -rf "$new"
}

if [ ! -e "$RUN/kit.env" ]; then
  if [ -z "${LM_ZOO_DATA:-}" ] && [ -d ../shared/data ]; then  # the default beside the checkout
    LM_ZOO_DATA=$(cd ../shared/data && pwd)
    export LM_ZOO_DATA
  fi
  mkdir -p "$RUN/src"
  # rc 1: a file (a cache) changed while it was read, copied as it was
  tar --warning=no-file-changed --exclude=./.git --exclude=./.venv --exclude=./build \
      --exclude=./runs --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache \
      --exclude=.hypothesis -cf - . | tar -C "$RUN/src" -xf - || [ "${PIPESTATUS[0]}" = 1 ]
  KIT=${KIT:-$RUN/src/launch/gpu_run_kit.sh}
  # stdin from /dev/null and a session of its own: the call's end does not stop it
  # setsid(1), or where util-linux is missing Python's os.setsid
  detach=(setsid)
  command -v setsid >/dev/null || detach=(python3 -c \
      'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])')
  "${detach[@]}" bash -c 'bash "$1" "$2" > "$2/kit.log" 2>&1; echo $? > "$2/exit_code"' \
      kit "$KIT" "$RUN" < /dev/null > /dev/null 2>&1 &
  # written once the kit is started: a call that stops before starts it again
  env | grep -E '^(KIT_|AGREEMENT_|MINUTES=|SEEDS_|TRAIN_CONFIG=|WHEELS=|LM_ZOO_DATA=|PYTHON=)' \
      > "$RUN/kit.env" || true
  echo "started $KIT into $RUN"
fi

trap 'pack_all PROFILES=1; cat "$PACK/status.txt"; exit 143' TERM INT
deadline=$((SECONDS + SECONDS_TO_WAIT))
packed=$SECONDS
while [ ! -e "$RUN/exit_code" ] && [ $SECONDS -lt $deadline ]; do
  sleep 2 & wait $!  # a TERM is taken at once, not after the sleep
  if [ $((SECONDS - packed)) -ge "$PACK_EVERY" ]; then
    pack_all
    packed=$SECONDS
  fi
done
pack_all PROFILES=1
cat "$PACK/status.txt"
