"""Meta-training stopped and continued gives what meta-training never stopped
gives: `meta_train` from a state its `after_step` saw, and a work
directory's meta-training stopped by a signal and run again."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm_zoo.cells import LSTMCell
from lm_zoo.configs import meta_training_config
from lm_zoo.errors import Preempted
from lm_zoo.evaluation import MetaTrainState, meta_train
from lm_zoo.models import Embedding, RecurrentLM, Softmax, Stack, init_params
from lm_zoo.optim import GateNetwork
from lm_zoo.runs.checkpoints import restore_tree
from lm_zoo.training import meta_train_workdir, trained
from lm_zoo.training.meta_learner import progress_folder, save_progress


def _flat(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize('carry_over', [False, True])
def test_meta_training_continued_from_a_state_it_showed_is_as_never_stopped(carry_over):
  model = RecurrentLM(Embedding(7, 3), Stack([LSTMCell(4)]), Softmax(7))
  params = init_params(model, jax.random.key(0))
  net = GateNetwork(hidden=3, learning_rate=0.5)
  meta = net.init(jax.random.key(1), jnp.zeros((1, 5)))
  stream = np.random.default_rng(4).integers(0, 7, 61)
  # Rows of 30 tokens hold two windows of 4 x 3: with carry_over, step 2
  # starts afresh and step 3 continues from the weights step 2 left.
  run = lambda **kw: meta_train(
    model, net.apply, meta, params, None, stream, 5, 4, 3, 2, optax.adam(0.01), 3,
    carry_over=carry_over, **kw,
  )  # fmt: skip
  seen = []
  whole = run(after_step=seen.append)
  assert [state.step for state in seen] == [1, 2, 3, 4, 5]
  for stopped in (seen[0], seen[2]):
    resumed = run(start=stopped)
    np.testing.assert_array_equal(_flat(resumed.meta_params), _flat(whole.meta_params))
    np.testing.assert_array_equal(resumed.losses, whole.losses)
  if carry_over:  # the weights the rule left are carried into the next step
    assert not np.array_equal(_flat(seen[2].theta), _flat(params))


def _config(**fields):
  config = meta_training_config()
  config.update(
    meta_steps=5,
    num_updates=2,
    segment_length=3,
    batch_size=2,
    prior='rms',
    initial_learning_rate=1e-2,
    initial_decay=0.5,
    fisher_batches=2,
    fisher_batch_size=2,
    hidden=4,
    carry_over=True,
    checkpoint_every=2,
  )
  config.evaluation.splits = ()
  config.update(fields)
  return config


def _rule(folder):
  tree, meta = restore_tree(folder)
  return _flat(tree['meta_params']), meta['losses']


def _signal_at(monkeypatch, step):
  """SIGTERM to this process after meta-step `step`, as a preemption sends it."""
  keep = trained._keep_progress

  def keep_with_signal(state, *args):
    if state.step == step:
      os.kill(os.getpid(), signal.SIGTERM)
    keep(state, *args)

  monkeypatch.setattr(trained, '_keep_progress', keep_with_signal)


def test_a_signalled_meta_training_resumes_as_never_stopped(trained_workdir, tmp_path, monkeypatch):
  meta_train_workdir(trained_workdir, _config(output=str(tmp_path / 'whole')))
  output = tmp_path / 'stopped'
  with monkeypatch.context() as patch:
    _signal_at(patch, 3)  # between two saves: the signal's own save is the one resumed
    with pytest.raises(Preempted, match=r'SIGTERM received: .* after meta-step 3 of 5'):
      meta_train_workdir(trained_workdir, _config(output=str(output)))
  assert restore_tree(progress_folder(output))[1]['step'] == 3
  assert not output.exists()
  steps = []
  monkeypatch.setattr(trained, 'meta_train', lambda *a, **kw: steps.append(kw['start'].step) or
                      meta_train(*a, **kw))  # fmt: skip
  meta_train_workdir(trained_workdir, _config(output=str(output), log_every=1))
  assert steps == [3]
  whole, resumed = _rule(tmp_path / 'whole'), _rule(output)
  np.testing.assert_array_equal(resumed[0], whole[0])
  assert resumed[1] == whole[1] and len(whole[1]) == 5
  assert not progress_folder(output).exists()


def test_progress_of_another_meta_training_is_not_resumed(
  trained_workdir, tmp_path, monkeypatch, caplog
):
  output = tmp_path / 'rule'
  other = MetaTrainState(2, {'w': np.ones(3, np.float32)}, (), {}, (), np.ones(2))
  save_progress(progress_folder(output), other, digest='of-another-config')
  starts = []
  monkeypatch.setattr(trained, 'meta_train', lambda *a, **kw: starts.append(kw['start']) or
                      meta_train(*a, **kw))  # fmt: skip
  meta_train_workdir(trained_workdir, _config(output=str(output)))
  assert starts == [None]
  assert 'holds another meta-training: starting afresh' in caplog.text
  assert len(_rule(output)[1]) == 5 and not progress_folder(output).exists()


def test_checkpoint_every_must_be_a_whole_number_of_meta_steps(trained_workdir, tmp_path):
  from lm_zoo.errors import ConfigError

  with pytest.raises(ConfigError, match='checkpoint_every'):
    meta_train_workdir(trained_workdir, _config(output=str(tmp_path / 'r'), checkpoint_every=0))
