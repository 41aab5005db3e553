"""Presets (lm-zoo-export, lm_zoo.load of a folder or URL): the exported
weights are the checkpoint's, a preset scores and samples as its work
directory does, and a preset served by a real HTTP server on this host is
downloaded once, verified, refused when damaged and fetched again cleanly
after an interrupted download."""

import concurrent.futures
import hashlib
import http.server
import json
import pathlib
import re
import shutil
import threading

import numpy as np
import pytest
from flax import traverse_util
from safetensors.numpy import load_file

import lm_zoo
from lm_zoo.errors import ConfigError
from lm_zoo.presets import parse_size
from lm_zoo.runs.export import export
from lm_zoo.training import train_and_evaluate

TEXT = 'the company said it expects higher sales\nshares rose in new york trading'


@pytest.fixture(scope='module')
def run(tmp_path_factory, data_dir):
  from conftest import tiny_lm_config

  workdir = tmp_path_factory.mktemp('trained') / 'run'
  config = tiny_lm_config(data_dir)
  config.train.num_epochs = 1
  train_and_evaluate(config, workdir, command=f'lm-zoo-train --workdir={workdir}')
  return workdir


@pytest.fixture(scope='module')
def preset(run, tmp_path_factory):
  return export(run, tmp_path_factory.mktemp('presets') / 'tiny')


@pytest.fixture(scope='module')
def trained(run):
  return lm_zoo.load(run)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv('LM_ZOO_CACHE', str(tmp_path / 'cache'))
  return tmp_path / 'cache'


def config_flags_module(path: str):
  """The config file at `path` as ml_collections' --config flag loads it."""
  import importlib.util

  spec = importlib.util.spec_from_file_location('config_file', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _same_model(model, trained):
  assert model.score(TEXT).perplexity == trained.score(TEXT).perplexity  # bit-equal
  assert model.generate('the company', num_tokens=8, num_samples=2, seed=3) == trained.generate(
    'the company', num_tokens=8, num_samples=2, seed=3
  )


def test_a_preset_scores_and_samples_as_its_work_directory(preset, trained, run):
  _same_model(lm_zoo.load(preset), trained)
  # The config travels without the trainer's data folder, and is otherwise the run's.
  exported, original = (
    json.loads((folder / 'config.json').read_text()) for folder in (preset, run)
  )
  assert original['data'].pop('data_dir') and exported['data'].pop('data_dir') == ''
  assert exported == original


def test_the_model_card_gives_size_data_and_results(preset, run):
  card = (preset / 'README.md').read_text()
  weights = load_file(str(preset / 'model.safetensors'))
  assert f'parameters: {sum(a.size for a in weights.values()):,}' in card
  summary = json.loads((run / 'summary.json').read_text())
  assert f'test: perplexity {summary["test"]["perplexity"]:.4g}' in card
  assert '10,000 word tokens' in card and '## Intended use and limitations' in card
  (command,) = (run / 'commands.txt').read_text().splitlines()  # the line train_and_evaluate added
  assert command.endswith(f': lm-zoo-train --workdir={run}') and f'    {command}\n' in card


def test_the_model_card_s_command_trains_the_run_s_config_again(preset, run):
  from lm_zoo.runs.model_card import RETRAIN_COMMAND

  card = (preset / 'README.md').read_text()
  assert f'    {RETRAIN_COMMAND}\n' in card
  # experiments/NAME.py is the installed package's where no such file is (lm_zoo.programs)
  config_file, _, folder = RETRAIN_COMMAND.split()[1].removeprefix('--config=').partition(':')
  assert folder == 'FOLDER'
  again = config_flags_module(pathlib.Path(lm_zoo.__file__).parent / config_file).get_config(
    str(preset)
  )
  original = lm_zoo.runs.load_config(run)
  original.data.data_dir = ''  # the trainer's folder stays behind; lm-zoo-train names its own
  assert again == original


def test_the_weights_file_holds_the_checkpoint_params_by_path(preset, trained):
  expected = traverse_util.flatten_dict(trained.params, sep='/')
  saved = load_file(str(preset / 'model.safetensors'))
  assert sorted(saved) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_array_equal(saved[key], np.asarray(value))
    assert saved[key].dtype == value.dtype


def test_sha256sums_lists_every_other_file_with_its_digest(preset):
  lines = (preset / 'SHA256SUMS').read_text().splitlines()
  listed = dict(reversed(line.split('  ', 1)) for line in lines)
  assert sorted(listed) == sorted(p.name for p in preset.iterdir() if p.name != 'SHA256SUMS')
  for name, digest in listed.items():
    assert hashlib.sha256((preset / name).read_bytes()).hexdigest() == digest


def test_small_shards_split_the_weights_and_load_to_the_same_params(run, trained, tmp_path):
  sharded = export(run, tmp_path / 'sharded', max_shard_size='2KB')
  files = sorted(p.name for p in sharded.glob('*.safetensors'))
  assert len(files) > 1 and not (sharded / 'model.safetensors').exists()
  assert all(re.fullmatch(rf'model-\d{{5}}-of-{len(files):05d}\.safetensors', f) for f in files)
  index = json.loads((sharded / 'model.safetensors.index.json').read_text())
  assert sorted(set(index['weight_map'].values())) == files
  for name in files:  # each shard holds what the index says, under 2KB unless one array
    held = load_file(str(sharded / name))
    assert sorted(held) == sorted(k for k, f in index['weight_map'].items() if f == name)
    assert len(held) == 1 or sum(a.nbytes for a in held.values()) <= 2000
  loaded = lm_zoo.load(sharded)
  for key, value in traverse_util.flatten_dict(trained.params, sep='/').items():
    np.testing.assert_array_equal(traverse_util.flatten_dict(loaded.params, sep='/')[key], value)


def test_a_changed_byte_in_a_shard_of_a_preset_folder_is_refused(run, trained, tmp_path):
  sharded = export(run, tmp_path / 'sharded', max_shard_size='2KB')
  card = sharded / 'README.md'
  card.write_text(card.read_text() + '\nEdited by its publisher.\n')  # not what is loaded
  _same_model(lm_zoo.load(sharded), trained)
  shard = max(sharded.glob('model-*.safetensors'), key=lambda p: p.stat().st_size)
  data = bytearray(shard.read_bytes())
  data[-1] ^= 1  # the last byte of an array: it still decodes
  shard.write_bytes(bytes(data))
  with pytest.raises(ConfigError) as err:
    lm_zoo.load(sharded)
  assert str(err.value) == (
    f"{shard} is damaged: its sha256 differs from SHA256SUMS'; export or download the preset again"
  )


def test_sizes_read_their_units():
  assert parse_size('2GB') == 2 * 10**9
  assert parse_size('1.5 KiB') == 1536
  assert parse_size(300) == 300
  for bad in ('2 parsecs', '', '0B', '-1MB'):
    with pytest.raises(ConfigError, match='max_shard_size'):
      parse_size(bad)


def test_another_preset_format_and_a_used_output_are_refused(preset, run, tmp_path):
  other = tmp_path / 'other'
  shutil.copytree(preset, other)
  record = json.loads((other / 'preset.json').read_text())
  (other / 'preset.json').write_text(json.dumps({**record, 'format_version': 99}))
  with pytest.raises(ConfigError, match='format 99') as err:
    lm_zoo.load(other)
  assert '\n' not in str(err.value)
  with pytest.raises(ConfigError, match='not empty'):
    export(run, other)


class _Server:
  """A preset folder served over HTTP on 127.0.0.1, counting requests; one
  file may be cut off after `cut` bytes (the connection closed mid-file)."""

  def __init__(self, folder: pathlib.Path):
    self.folder, self.requests, self.cut = folder, [], None
    self.ranges = []  # the Range headers answered with 206, when `serve_ranges`
    self.serve_ranges = False
    server = self

    class Handler(http.server.SimpleHTTPRequestHandler):
      def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=str(server.folder), **kwargs)

      def do_GET(self):
        server.requests.append(self.path)
        name = self.path.rsplit('/', 1)[-1]
        if server.cut and name == server.cut[0]:
          data = pathlib.Path(self.translate_path(self.path)).read_bytes()
          self.send_response(200)
          self.send_header('Content-Length', str(len(data)))
          self.end_headers()
          self.wfile.write(data[: server.cut[1]])
          self.wfile.flush()
          self.close_connection = True
          server.cut = None
          return
        if server.serve_ranges and self.headers.get('Range'):
          data = pathlib.Path(self.translate_path(self.path)).read_bytes()
          start = int(re.fullmatch(r'bytes=(\d+)-', self.headers['Range']).group(1))
          server.ranges.append(self.headers['Range'])
          self.send_response(206)
          self.send_header('Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}')
          self.send_header('Content-Length', str(len(data) - start))
          self.end_headers()
          self.wfile.write(data[start:])
          return
        super().do_GET()

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/tiny'
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def served(preset, tmp_path):
  root = tmp_path / 'www'
  shutil.copytree(preset, root / 'tiny')
  server = _Server(root)
  yield server, root / 'tiny'
  server.close()


def test_a_url_is_downloaded_once_and_verified(served, trained, cache):
  server, _ = served
  _same_model(lm_zoo.load(server.url), trained)
  fetched = len(server.requests)
  assert fetched == len((served[1] / 'SHA256SUMS').read_text().splitlines()) + 1
  assert server.requests[0].endswith('/SHA256SUMS')
  again = lm_zoo.load(server.url + '/')
  assert len(server.requests) == fetched  # the cache answered
  assert again.workdir.parent == cache


def test_a_damaged_file_is_refused_and_not_kept(served, cache):
  server, folder = served
  data = bytearray((folder / 'model.safetensors').read_bytes())
  data[-1] ^= 1
  (folder / 'model.safetensors').write_bytes(bytes(data))
  with pytest.raises(ConfigError, match='model.safetensors is damaged') as err:
    lm_zoo.load(server.url)
  assert '\n' not in str(err.value)
  assert not list(cache.iterdir())


def test_an_edited_model_card_still_loads(served, trained):
  """The card is the publisher's to edit: its sum is not held against it,
  and the copy is the served one."""
  server, folder = served
  card = (folder / 'README.md').read_text() + '\nEdited on the Hub.\n'
  (folder / 'README.md').write_text(card)
  model = lm_zoo.load(server.url)
  _same_model(model, trained)
  assert (model.workdir / 'README.md').read_text() == card


def test_an_interrupted_download_fails_then_fetches_again_cleanly(served, trained):
  server, folder = served
  server.cut = ('model.safetensors', (folder / 'model.safetensors').stat().st_size // 2)
  with pytest.raises(ConfigError, match='run again') as err:
    lm_zoo.load(server.url)
  assert '\n' not in str(err.value)
  _same_model(lm_zoo.load(server.url), trained)


def test_an_interrupted_download_resumes_where_the_server_takes_a_range(served, trained):
  server, folder = served
  server.serve_ranges = True
  half = (folder / 'model.safetensors').stat().st_size // 2
  server.cut = ('model.safetensors', half)
  with pytest.raises(ConfigError, match='run again'):
    lm_zoo.load(server.url)
  _same_model(lm_zoo.load(server.url), trained)
  assert server.ranges == [f'bytes={half}-']  # only the rest was asked for


def test_plain_http_is_for_this_host_only():
  with pytest.raises(ConfigError, match='https'):
    lm_zoo.load('http://example.com/presets/tiny')


def test_hub_paths_without_the_network(preset, trained, monkeypatch, tmp_path):
  """hf:// without the network: the missing extra's error, then
  huggingface_hub replaced by a stand-in whose snapshot_download copies a
  local folder, to check the repository and revision it is asked for, the
  load and the checksums; the hub's own download is not exercised."""
  import sys
  import types

  monkeypatch.setitem(sys.modules, 'huggingface_hub', None)
  with pytest.raises(ConfigError, match=re.escape("pip install 'lm_zoo[hub]'")):
    lm_zoo.load('hf://someone/tiny')
  asked = []

  def snapshot_download(repo_id, revision=None, cache_dir=None):
    asked.append((repo_id, revision))
    target = pathlib.Path(cache_dir) / repo_id.replace('/', '--')
    if not target.exists():
      shutil.copytree(preset, target)
    return str(target)

  monkeypatch.setitem(
    sys.modules, 'huggingface_hub', types.SimpleNamespace(snapshot_download=snapshot_download)
  )
  _same_model(lm_zoo.load('hf://someone/tiny@v1'), trained)
  assert asked == [('someone/tiny', 'v1')]
  copy = next((tmp_path / 'cache' / 'hub').iterdir())
  (copy / 'README.md').write_text('An edited card.\n')  # the publisher's to edit
  _same_model(lm_zoo.load('hf://someone/tiny'), trained)
  (copy / 'vocab.json').write_text((copy / 'vocab.json').read_text() + ' ')
  with pytest.raises(ConfigError, match='vocab.json is damaged'):
    lm_zoo.load('hf://someone/tiny')
  with pytest.raises(ConfigError, match='OWNER/NAME'):
    lm_zoo.load('hf://tiny')


def test_export_refuses_bad_inputs_in_one_line(run, tmp_path):
  from conftest import run_script

  missing = run_script(
    ['launch/export.py', f'--workdir={tmp_path / "none"}', f'--output={tmp_path / "out"}']
  )
  used = tmp_path / 'used'
  used.mkdir()
  (used / 'notes.txt').write_text('mine')
  nonempty = run_script(['launch/export.py', f'--workdir={run}', f'--output={used}'])
  for refused, what in ((missing, 'is not a folder'), (nonempty, 'not empty')):
    assert refused.returncode == 1
    assert refused.stderr.strip().count('\n') == 0 and what in refused.stderr, refused.stderr


@pytest.mark.slow  # three programs, each loading JAX
def test_the_programs_export_and_read_a_preset(run, trained, tmp_path):
  from conftest import run_script

  out = tmp_path / 'preset'
  exported = run_script(
    ['launch/export.py', f'--workdir={run}', f'--output={out}', '--max_shard_size=3KB']
  )
  assert exported.returncode == 0, exported.stderr
  assert len(list(out.glob('model-*-of-*.safetensors'))) > 1
  generated = run_script(
    [
      'launch/generate.py',
      f'--workdir={out}',
      '--prompt=the company',
      '--num_tokens=6',
      '--num_samples=2',
      '--seed=5',
    ]
  )
  assert generated.returncode == 0, generated.stderr
  assert generated.stdout.splitlines() == [
    t.replace('\n', ' | ') for t in trained.generate('the company', 6, 2, seed=5)
  ]
  scored = run_script(['launch/evaluate.py', f'--workdir={out}', f'--output={tmp_path / "e.json"}'])
  assert scored.returncode == 0, scored.stderr
  summary = json.loads((run / 'summary.json').read_text())
  results = json.loads((tmp_path / 'e.json').read_text())['results']
  assert results['test']['perplexity'] == pytest.approx(summary['test']['perplexity'], rel=1e-5)
  assert not (out / 'evaluations').exists()  # a preset stays as it was published


def test_processes_asking_for_one_url_at_once_download_it_once(served, trained, cache):
  server, folder = served
  from lm_zoo.remote import resolve

  files = len((folder / 'SHA256SUMS').read_text().splitlines()) + 1
  with concurrent.futures.ThreadPoolExecutor(3) as pool:  # flock parts threads' opens too
    entries = list(pool.map(resolve, [server.url] * 3))
  assert len(set(entries)) == 1 and len(server.requests) == files
  assert sorted(p.name for p in cache.iterdir()) == [entries[0].name]  # no lock file left
  _same_model(lm_zoo.load(server.url), trained)
