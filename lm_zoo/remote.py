"""A preset named by URL, brought into a local cache (`resolve`): an
`https://` folder (`http://` on this host only), or a Hugging Face model
repository `hf://OWNER/NAME[@REVISION]` (the `[hub]` extra).

A URL's preset is downloaded once into $LM_ZOO_CACHE (default
~/.cache/lm_zoo), a folder per URL's hash: SHA256SUMS first, then each file
it lists to a temporary name, renamed when its sha256 matches. A file that
does not match is refused and the download discarded; an interrupted one
resumes (where the server takes a Range) or restarts on the next call. The
model card (README.md), which a publisher may edit (on the Hub, say), is
fetched but not held to its sum, as `presets.load_params` does not.
Processes that ask for a URL at once download it once: the others wait on
the cache's lock, then read the copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import logging
import os
import pathlib
import shutil
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterator

from lm_zoo.data.download import sha256_file
from lm_zoo.errors import ConfigError
from lm_zoo.presets import CARD_FILE, SUMS_FILE, read_sums, verify
from lm_zoo.progress import ProgressLog

log = logging.getLogger(__name__)

_LOCAL_HOSTS = ('localhost', '127.0.0.1', '::1')
_BLOCK = 1 << 16


def cache_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get('LM_ZOO_CACHE') or '~/.cache/lm_zoo').expanduser()


def is_remote(source: str | os.PathLike) -> bool:
  return isinstance(source, str) and source.startswith(('https://', 'http://', 'hf://'))


def resolve(source: str | os.PathLike) -> pathlib.Path:
  """The local folder of `source`: a path as it is, a URL's cached copy
  (downloaded first when not cached)."""
  if not is_remote(source):
    return pathlib.Path(source)
  if source.startswith('hf://'):
    return _from_hub(source)
  return _from_url(source)


def _from_hub(source: str) -> pathlib.Path:
  """snapshot_download of hf://OWNER/NAME[@REVISION], its SHA256SUMS checked."""
  name, _, revision = source[len('hf://') :].partition('@')
  if name.count('/') != 1 or not all(name.split('/')):
    raise ConfigError(f'{source} names no model repository: write hf://OWNER/NAME[@REVISION]')
  try:
    import huggingface_hub
  except ImportError:
    raise ConfigError(
      f"{source} needs huggingface_hub, which is not installed: pip install 'lm_zoo[hub]'"
    ) from None
  folder = pathlib.Path(
    huggingface_hub.snapshot_download(
      repo_id=name, revision=revision or None, cache_dir=str(cache_dir() / 'hub')
    )
  )
  verify(folder, skip=(CARD_FILE,))
  return folder


def _from_url(url: str) -> pathlib.Path:
  parts = urllib.parse.urlsplit(url)
  if parts.scheme == 'http' and parts.hostname not in _LOCAL_HOSTS:
    raise ConfigError(
      f'{url}: a preset is downloaded over https only (http on this host): use its https:// address'
    )
  base = url.rstrip('/') + '/'
  entry = cache_dir() / hashlib.sha256(base.encode()).hexdigest()[:24]
  if entry.is_dir():
    return entry
  with _cache_lock(entry.parent):
    if not entry.is_dir():  # another process may have brought it meanwhile
      _download_preset(base, entry)
  return entry


@contextlib.contextmanager
def _cache_lock(folder: pathlib.Path) -> Iterator[None]:
  """Holds the cache folder's lock (flock on the folder itself, so that no
  lock file is left behind); waits, saying so, while another process holds it."""
  folder.mkdir(parents=True, exist_ok=True)
  descriptor = os.open(folder, os.O_RDONLY)
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      log.info('Waiting for another process downloading into %s', folder)
      fcntl.flock(descriptor, fcntl.LOCK_EX)
    yield
  finally:
    os.close(descriptor)  # releases the lock


def _download_preset(base: str, entry: pathlib.Path) -> None:
  """Downloads the preset at `base` (a URL ending in /) into `entry`."""
  partial = entry.with_name(entry.name + '.partial')
  partial.mkdir(parents=True, exist_ok=True)
  try:
    sums_text = _fetch_small(base + SUMS_FILE)
    sums = read_sums(sums_text, base + SUMS_FILE)
    for name, digest in sums.items():
      _download(
        base + urllib.parse.quote(name),
        partial / name,
        None if name == CARD_FILE else digest,
        partial,
      )
    (partial / SUMS_FILE).write_text(sums_text)
  except _Damaged as err:
    shutil.rmtree(partial, ignore_errors=True)
    raise ConfigError(str(err)) from None
  verify(partial, skip=(CARD_FILE,))
  os.replace(partial, entry)


class _Damaged(Exception):
  """A downloaded file's sha256 differs from SHA256SUMS'."""


def _interrupted(url: str, err: BaseException) -> ConfigError:
  return ConfigError(
    f'the download of {url} failed ({type(err).__name__}: {err}): run again to resume it'
  )


def _fetch_small(url: str) -> str:
  try:
    with urllib.request.urlopen(url, timeout=60) as response:
      return response.read().decode()
  except urllib.error.HTTPError as err:
    raise ConfigError(
      f'{url}: HTTP {err.code} {err.reason}: is the address that of a preset '
      'folder (written by lm-zoo-export)?'
    ) from None
  except (OSError, http.client.HTTPException, UnicodeDecodeError) as err:
    raise _interrupted(url, err) from None


def _download(url: str, path: pathlib.Path, digest: str | None, partial: pathlib.Path) -> None:
  """Downloads `url` to `path` through PATH.part, resuming a part that an
  earlier call left; renames it when its sha256 is `digest` (None: any)."""
  if path.is_file() and digest is not None and sha256_file(path) == digest:
    return
  part = path.with_name(path.name + '.part')
  have = part.stat().st_size if part.is_file() else 0
  request = urllib.request.Request(url, headers={'Range': f'bytes={have}-'} if have else {})
  try:
    with urllib.request.urlopen(request, timeout=60) as response:
      resumed = response.status == 206
      mode = 'ab' if resumed else 'wb'
      done = have if resumed else 0
      total = done + int(response.headers.get('Content-Length') or 0)
      progress = ProgressLog(f'downloading {path.name}', max(total, 1), unit='bytes', interval=5.0)
      with open(part, mode) as out:
        for block in iter(lambda: response.read(_BLOCK), b''):
          out.write(block)
          done += len(block)
          progress.update(done)
      if total and done < total:
        raise http.client.IncompleteRead(b'', total - done)
  except urllib.error.HTTPError as err:
    if err.code == 416:  # the part is whole already, or longer than the file: start again
      part.unlink(missing_ok=True)
      return _download(url, path, digest, partial)
    raise ConfigError(
      f"{url}: HTTP {err.code} {err.reason}: the preset's SHA256SUMS lists "
      'it, but the server has no such file'
    ) from None
  except (OSError, http.client.HTTPException) as err:
    raise _interrupted(url, err) from None
  if digest is not None and sha256_file(part) != digest:
    raise _Damaged(
      f"{url} is damaged: its sha256 differs from the preset's SHA256SUMS; the "
      'download was discarded, fetch it again or ask its publisher'
    )
  os.replace(part, path)
