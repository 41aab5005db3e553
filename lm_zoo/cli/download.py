"""Downloads the datasets with verified sha256 checksums (`lm-zoo-download`, or
`python launch/download.py`), and optionally writes the text corpora as TFDS
datasets in ArrayRecord files (lm_zoo/data/tfds_export.py):

  lm-zoo-download                                  # all four into $LM_ZOO_DATA
  lm-zoo-download --datasets=ptb,ptb_char --data_dir=data
  lm-zoo-download --verify_only                    # check, fetch nothing
  lm-zoo-download --data_dir=data --mirror=file:///mnt/data  # a checked local copy
  lm-zoo-download --datasets=ptb --tfds_dir=tfds   # then tfds/lm_zoo_corpus/ptb/1.0.0

Files already present with the right checksum are kept. The sources and
checksums are listed in lm_zoo/data/download.py.
"""

import sys

from absl import app, flags

from lm_zoo import cli
from lm_zoo.data.corpora import chosen_data_dir
from lm_zoo.data.download import FILES, download, verify
from lm_zoo.errors import ConfigError, DataError

flags.DEFINE_list('datasets', list(FILES), f'Datasets to fetch, from {", ".join(FILES)}.')
flags.DEFINE_string(
  'data_dir',
  None,
  f'Data folder; default: ${cli.DATA_DIR_ENV}, else ../shared/data. Created when missing.',
)
flags.DEFINE_bool(
  'verify_only',
  False,
  'Only check the files: list those missing or with a wrong checksum, and fail when there are any.',
)
flags.DEFINE_string(
  'mirror',
  None,
  'Fetch from this URL of a folder laid out as the '
  'data folder (e.g. file:///mnt/data) instead of the public sources; '
  'checksums are checked all the same.',
)
flags.DEFINE_string(
  'tfds_dir',
  None,
  'Also write each text corpus of --datasets as '
  'the TFDS dataset lm_zoo_corpus/CORPUS in ArrayRecord files here.',
)
FLAGS = flags.FLAGS


def _verify(data_dir: str) -> None:
  bad = {dataset: verify(dataset, data_dir) for dataset in FLAGS.datasets}
  for dataset, paths in bad.items():
    print(f'{dataset}: {"missing or wrong: " + ", ".join(paths) if paths else "ok"}')
  if any(bad.values()):
    raise DataError(
      f'files missing or with a wrong checksum in {data_dir}: run '
      'lm-zoo-download without --verify_only to fetch them'
    )


def _export_tfds(data_dir: str) -> None:
  try:
    from lm_zoo.data.tfds_export import TEXT_CORPORA, build_tfds_dataset
  except ImportError as err:
    raise ConfigError(
      f"--tfds_dir needs tensorflow-datasets and array_record ({err}): pip install 'lm_zoo[tfds]'"
    ) from None
  for dataset in FLAGS.datasets:
    if dataset in TEXT_CORPORA:
      print(f'{dataset}: TFDS dataset in {build_tfds_dataset(dataset, data_dir, FLAGS.tfds_dir)}')
    else:
      print(f'{dataset}: no TFDS export (text corpora only)')


def _download_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  data_dir = chosen_data_dir(FLAGS.data_dir or cli.env_data_dir())  # created when missing

  def prepare():
    if FLAGS.verify_only:
      _verify(data_dir)
    else:
      for path, status in download(FLAGS.datasets, data_dir, FLAGS.mirror).items():
        print(f'{path}: {status}')
    if FLAGS.tfds_dir:
      _export_tfds(data_dir)

  cli.run(prepare)


def main():
  """The `lm-zoo-download` console script."""
  cli.main(sys.modules[__name__], _download_program)
