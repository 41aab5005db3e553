"""launch/gpu_kit_background.sh: the kit started once, detached, then waited
on and packed by each call, with a stand-in kit whose files and end the test
controls."""

import os
import re
import subprocess
import tarfile
import time

import pytest
from conftest import REPO

# The stand-in: counts its starts, writes figures, a work directory with
# checkpoints, optimized HLO, then (once told to go on) a profile of 17 MiB of
# noise, and ends with exit code 3.
STAND_IN = r"""
set -e
out=$1
echo started >> "$out/starts"
echo '{"rows": 1}' > "$out/benchmark.json"
mkdir -p "$out/run/checkpoints/7" "$out/run/best/7" "$out/hlo_scans"
echo step > "$out/run/metrics.jsonl"
echo weights > "$out/run/checkpoints/7/params"
echo weights > "$out/run/best/7/params"
echo HloModule > "$out/hlo_scans/train.txt"
for _ in $(seq 300); do [ -e "$out/go" ] && break; sleep 0.2; done
head -c $((17 * 1024 * 1024)) /dev/urandom > "$out/profile_scans.bin"
echo "every figure is in $out"
exit 3
"""


def background(seconds, pack, run, **env):
  """A call with this environment alone of what the kit reads."""
  kits = re.compile(r'(KIT_|AGREEMENT_|MINUTES$|SEEDS_|TRAIN_CONFIG$|WHEELS$|LM_ZOO_DATA$)')
  others = {k: v for k, v in os.environ.items() if not kits.match(k)}
  return subprocess.run(
    ['bash', 'launch/gpu_kit_background.sh', str(seconds), str(pack), str(run)],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env={**others, **env},
  )


def members(archive):
  with tarfile.open(archive) as tar:
    return {m.name.removeprefix('./') for m in tar.getmembers() if m.isfile()}


def test_the_kit_starts_once_and_each_call_packs_what_it_has_written(tmp_path):
  kit = tmp_path / 'stand_in.sh'
  kit.write_text(STAND_IN)
  run = tmp_path / 'run'
  first = background(
    0, tmp_path / 'pack1', run, KIT=str(kit), KIT_PARTS='kernels', LM_ZOO_DATA='rel/data'
  )
  assert first.returncode == 0, first.stderr
  assert first.stdout.startswith(f'started {kit} into {run}\n')
  # A relative data folder is the caller's: made absolute for the kit's copy.
  recorded = set((run / 'kit.env').read_text().splitlines())
  assert recorded == {'KIT_PARTS=kernels', f'LM_ZOO_DATA={REPO}/rel/data'}

  # A later call neither starts it again nor reads its environment.
  second = background(1, tmp_path / 'pack2', run, KIT=str(kit), KIT_PARTS='seeds')
  assert second.returncode == 0, second.stderr
  assert 'started' not in second.stdout
  assert (tmp_path / 'pack2' / 'status.txt').read_text().startswith('running\n')
  assert (run / 'starts').read_text() == 'started\n'
  assert members(tmp_path / 'pack2' / 'figures.tar.gz') == {
    'benchmark.json',
    'run/metrics.jsonl',
    'kit.env',
    'starts',
  }
  assert members(tmp_path / 'pack2' / 'hlo.tar.gz') == {'hlo_scans/train.txt'}

  (run / 'go').touch()
  last = background(60, tmp_path / 'pack3', run, KIT=str(kit), MAX_PIECES='1')
  assert last.returncode == 0, last.stderr
  status = (tmp_path / 'pack3' / 'status.txt').read_text()
  assert status.startswith(
    f"finished: exit code 3\n--- the log's last lines\nevery figure is in {run}\n"
  )
  assert status.endswith('profiles: 2 pieces, only the first 1 kept\n')
  assert (tmp_path / 'pack3' / 'kit.log').read_text() == f'every figure is in {run}\n'
  assert sorted(p.name for p in (tmp_path / 'pack3').glob('profiles.*')) == ['profiles.tar.gz.00']

  # With the default number of pieces, they join into the whole profile.
  again = background(0, tmp_path / 'pack4', run)
  assert again.returncode == 0, again.stderr
  pieces = sorted((tmp_path / 'pack4').glob('profiles.tar.gz.*'))
  assert [p.name for p in pieces] == ['profiles.tar.gz.00', 'profiles.tar.gz.01']
  whole = tmp_path / 'profiles.tar.gz'
  whole.write_bytes(b''.join(p.read_bytes() for p in pieces))
  assert members(whole) == {'profile_scans.bin'}
  with tarfile.open(whole) as tar:
    assert tar.extractfile('profile_scans.bin').read() == (run / 'profile_scans.bin').read_bytes()


def test_a_call_packs_while_it_waits_and_when_it_is_stopped(tmp_path):
  """A host's time limit may stop a call before its wait ends: what the kit
  has written is packed every PACK_EVERY seconds and on TERM, so the call
  still returns it. The kit runs from a copy of the checkout in RUN/src."""
  kit = tmp_path / 'stand_in.sh'
  kit.write_text(STAND_IN)
  run, pack = tmp_path / 'run', tmp_path / 'pack'
  kits = re.compile(r'(KIT_|AGREEMENT_|MINUTES$|SEEDS_|TRAIN_CONFIG$|WHEELS$|LM_ZOO_DATA$)')
  env = {k: v for k, v in os.environ.items() if not kits.match(k)}
  call = subprocess.Popen(
    ['bash', 'launch/gpu_kit_background.sh', '60', str(pack), str(run)],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
    env={**env, 'KIT': str(kit), 'PACK_EVERY': '1'},
  )
  try:
    deadline = time.monotonic() + 30
    while not (pack / 'figures.tar.gz').exists() and time.monotonic() < deadline:
      time.sleep(0.2)
    assert call.poll() is None  # packed while waiting
    assert (pack / 'status.txt').read_text().startswith('running\n')
    assert 'benchmark.json' in members(pack / 'figures.tar.gz')
    (run / 'hlo_late').mkdir()  # written after that pack: the stopped call's pack has it
    (run / 'hlo_late' / 'x.txt').write_text('HloModule')
  finally:
    call.terminate()
  assert call.wait(timeout=30) == 143
  assert 'hlo_late/x.txt' in members(pack / 'hlo.tar.gz')
  assert not (pack / '.packing').exists()
  assert (run / 'src' / 'launch' / 'gpu_run_kit.sh').read_bytes() == (
    REPO / 'launch' / 'gpu_run_kit.sh'
  ).read_bytes()
  (run / 'go').touch()  # the stand-in ends


@pytest.mark.parametrize('args', [[], ['soon', 'pack']])
def test_a_call_without_seconds_and_pack_is_refused(args, tmp_path):
  ran = subprocess.run(
    ['bash', 'launch/gpu_kit_background.sh', *args], cwd=REPO, capture_output=True, text=True
  )
  assert ran.returncode == 2
  assert ran.stderr == (
    'usage: launch/gpu_kit_background.sh SECONDS PACK [RUN]: SECONDS to wait, a whole number\n'
  )
  assert not (REPO / 'pack').exists()
