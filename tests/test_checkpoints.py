"""Checkpoints: restoring into the current model's shapes, their format, and
damage named as damage."""

import json
import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import lm_zoo
from lm_zoo.errors import CheckpointError, ConfigError
from lm_zoo.runs import checkpoints as checkpoints_module
from lm_zoo.runs.checkpoints import FORMAT_VERSION, ORBAX_TMP, Checkpoints, restore_tree, save_tree


def params(vocab=7, features=3):
  kernel = jnp.arange(vocab * features, dtype=jnp.float32).reshape(vocab, features)
  return {
    'head': {'kernel': kernel, 'bias': jnp.arange(vocab, dtype=jnp.float32)},
    'bridge': {'dense': {'kernel': jnp.ones((features, vocab))}},
    'stack': {'cell_0': {'recurrent_kernel': jnp.ones((features, 4 * features))}},
  }


def _edit_meta(folder, edit):
  path = folder / 'meta' / 'metadata'
  meta = json.loads(path.read_text())
  edit(meta)
  path.write_text(json.dumps(meta))


def test_a_checkpoint_records_its_format_and_one_of_another_is_refused(tmp_path):
  saved = Checkpoints(tmp_path)
  saved.save_best(3, params(), {'epoch': 1})
  saved.close()
  meta = json.loads((tmp_path / 'best' / '3' / 'meta' / 'metadata').read_text())
  assert (meta['format_version'], meta['lm_zoo_version']) == (FORMAT_VERSION, lm_zoo.__version__)
  _, meta = Checkpoints(tmp_path).restore_best(params())
  assert meta == {'epoch': 1}  # the digests and the format are the checkpoint's own
  older = FORMAT_VERSION - 1  # the format before this one's parameter tree
  _edit_meta(
    tmp_path / 'best' / '3', lambda m: m.update(format_version=older, lm_zoo_version='0.0.9')
  )
  with pytest.raises(CheckpointError) as refused:
    Checkpoints(tmp_path).restore_best(params())
  assert str(refused.value) == (
    f'the checkpoint {tmp_path}/best/3 was written by lm_zoo 0.0.9 (format {older}); this is '
    f'lm_zoo {lm_zoo.__version__} (format {FORMAT_VERSION}), which reads only its own: use '
    'that lm_zoo to read it, or train again in a new --workdir.'
  )


def test_a_checkpoint_without_its_digests_or_metadata_is_damaged(tmp_path):
  """Every checkpoint keeps its arrays' digests, and orbax its metadata: one
  without is damage, named as such (not restored unverified, nor taken for
  a checkpoint of another model)."""
  saved = Checkpoints(tmp_path)
  saved.save_latest(4, params(), {'epoch': 1})
  saved.close()
  folder = tmp_path / 'checkpoints' / '4'
  _edit_meta(folder, lambda m: m.pop('array_digests'))
  with pytest.raises(
    CheckpointError, match=f'the checkpoint {folder} is damaged: its meta has no array digests'
  ):
    Checkpoints(tmp_path).restore_latest(params())
  (folder / 'state' / '_METADATA').unlink()
  with pytest.raises(CheckpointError) as refused:
    Checkpoints(tmp_path).restore_latest(params())
  assert str(refused.value) == (
    f'no intact checkpoint to resume from in {tmp_path}/checkpoints: '
    f'the checkpoint {folder} is damaged: {folder}/state/_METADATA '
    f'is missing; delete {folder}, or train again in a new '
    '--workdir.'
  )


def test_resuming_skips_a_damaged_newest_checkpoint_for_the_intact_one_before(tmp_path, caplog):
  saved = Checkpoints(tmp_path)
  saved.save_latest(4, params(), {'epoch': 1})
  saved.save_latest(8, jax.tree.map(lambda x: x + 1, params()), {'epoch': 2})
  saved.close()
  newest = tmp_path / 'checkpoints' / '8'
  (newest / 'state' / '_METADATA').unlink()
  with caplog.at_level(logging.WARNING, logger='lm_zoo'):
    state, meta = Checkpoints(tmp_path).restore_latest(params())
  assert meta == {'epoch': 1}
  np.testing.assert_array_equal(state['head']['kernel'], params()['head']['kernel'])
  assert f'Skipping a damaged checkpoint: the checkpoint {newest} is damaged' in caplog.text
  assert f'Resuming from {tmp_path}/checkpoints/4, the newest intact checkpoint' in caplog.text


def test_a_checkpoint_of_other_shapes_is_refused_with_its_path(tmp_path):
  saved = Checkpoints(tmp_path)
  saved.save_best(5, params(features=3), {})
  saved.close()
  with pytest.raises(ConfigError, match='best/5 does not fit this model') as refused:
    Checkpoints(tmp_path).restore_best(params(features=4))
  message = str(refused.value)
  assert 'stack/cell_0/recurrent_kernel: saved (3, 12), this model (4, 16)' in message
  assert 'head/kernel: saved (7, 3), this model (7, 4)' in message


def test_save_tree_then_restore_tree_gives_the_tree_and_meta_back(tmp_path):
  tree = {'meta_params': {'w': jnp.arange(6.0).reshape(2, 3)}, 'precision': [jnp.ones(4)]}
  save_tree(tmp_path / 'learner', tree, {'hidden': 8})
  save_tree(tmp_path / 'learner', tree, {'hidden': 9})  # replaces
  restored, meta = restore_tree(tmp_path / 'learner')
  assert meta == {'hidden': 9}
  np.testing.assert_array_equal(restored['meta_params']['w'], tree['meta_params']['w'])
  np.testing.assert_array_equal(restored['precision'][0], tree['precision'][0])
  assert restore_tree(tmp_path / 'nothing') is None


def _state(value: float):
  return {'w': np.full((3, 2), value, np.float32)}


@pytest.mark.parametrize('killed_after', ['previous set aside', 'new one written'])
def test_a_kill_while_a_step_is_saved_again_leaves_a_whole_checkpoint(
  tmp_path, monkeypatch, killed_after
):
  """The epoch's end saves the step of a periodic checkpoint again; a kill
  in the middle of that leaves the previous checkpoint of the step or the
  new one, never neither (it was deleted before the new one was written)."""
  with Checkpoints(tmp_path) as checkpoints:
    checkpoints.save_latest(7, _state(1.0), {'epoch': 1})

  def killed(*args, **kwargs):
    raise KeyboardInterrupt('SIGKILL')

  with monkeypatch.context() as patched:
    if killed_after == 'previous set aside':
      patched.setattr(ocp.CheckpointManager, 'save', killed)
    else:  # before the previous checkpoint is removed
      patched.setattr(checkpoints_module, 'shutil', types.SimpleNamespace(rmtree=killed))
    checkpoints = Checkpoints(tmp_path)
    with pytest.raises(KeyboardInterrupt):
      checkpoints.save_latest(7, _state(2.0), {'epoch': 2})
  (tmp_path / 'checkpoints' / f'9{ORBAX_TMP}-123').mkdir()  # orbax's folder in the making
  with Checkpoints(tmp_path) as reopened:
    state, meta = reopened.restore_latest(_state(0.0))
  expected = (1.0, 1) if killed_after == 'previous set aside' else (2.0, 2)
  assert (float(state['w'][0, 0]), meta['epoch']) == expected
  assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()) == ['7']


def test_damage_that_still_decodes_is_found_by_the_digests(tmp_path):
  """Single flipped bits and 200 garbled bytes in the array files of best/:
  every restore either gives the saved arrays bit for bit or fails naming
  the checkpoint; none gives other weights."""
  weights = {
    'w': np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32),
    'b': np.arange(32, dtype=np.float32),
  }
  with Checkpoints(tmp_path) as checkpoints:
    checkpoints.save_best(3, weights, {'epoch': 1})
  files = sorted(
    p
    for p in (tmp_path / 'best' / '3' / 'state').rglob('*')
    if p.is_file() and p.parent.name == 'd'
  )
  rng = np.random.default_rng(1)
  refused = 0
  for case in range(12):
    path = files[case % len(files)]
    original = path.read_bytes()
    damaged = bytearray(original)
    if case == 11:
      start = int(rng.integers(0, max(1, len(damaged) - 200)))
      damaged[start : start + 200] = rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
    else:
      damaged[int(rng.integers(0, len(damaged)))] ^= 1 << int(rng.integers(0, 8))
    path.write_bytes(bytes(damaged))
    try:
      with Checkpoints(tmp_path) as checkpoints:
        restored, meta = checkpoints.restore_best(weights)
      for name in weights:
        np.testing.assert_array_equal(restored[name], weights[name])
      assert meta == {'epoch': 1}
    except CheckpointError as err:
      refused += 1
      assert f'the checkpoint {tmp_path / "best" / "3"} is ' in str(err)
      assert 'keeps no other copy' in str(err) or 'corrupt or truncated' in str(err)
    path.write_bytes(original)
  assert refused >= 3
