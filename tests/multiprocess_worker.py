"""One process of the multi-process training tests (tests/test_multiprocess.py):
`python multiprocess_worker.py WORKDIR OUT PROCESS_ID NUM_PROCESSES PORT DATA_DIR [EPOCHS [JSON]]`
trains a tiny model in WORKDIR for EPOCHS (2) epochs, with the config updated
by JSON (a dict of sections, e.g. '{"train": {"nonfinite": "rollback"}}'), restores its latest
checkpoint and writes what the tests compare to OUT/PROCESS_ID.npz: the
restored parameters and step, the step a SIGTERM stopped training at (0:
none), the summary, and the batch rows this process fed. NUM_PROCESSES 1 is
the single-process reference (no coordinator). The devices are simulated CPU
ones (XLA_FLAGS)."""

import json
import logging
import pathlib
import sys

import jax
import numpy as np

from lm_zoo.errors import Preempted

workdir, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
process_id, num_processes, port = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if num_processes > 1:
  jax.distributed.initialize(
    coordinator_address=f'127.0.0.1:{port}', num_processes=num_processes, process_id=process_id
  )

from lm_zoo.configs import base_config  # noqa: E402  (after initialize)
from lm_zoo.data import load_data  # noqa: E402
from lm_zoo.models import build_model  # noqa: E402
from lm_zoo.runs.checkpoints import Checkpoints  # noqa: E402
from lm_zoo.training import (  # noqa: E402
  create_train_state,
  data_mesh,
  make_optimizer,
  shard_batch,
  train_and_evaluate,
)

logging.basicConfig(level=logging.INFO, format=f'[{process_id}] %(message)s')
config = base_config()
config.data.update(
  data_dir=sys.argv[6],
  train_tokens=401,
  valid_tokens=121,
  test_tokens=91,
  batch_size=4,
  bptt=10,
  eval_batch_size=3,
  test_batch_size=3,
)
config.model.update(
  embed_size=16, hidden_size=16, num_layers=1, dropout_input=0.2, dropout_hidden=0.2
)
config.optimizer.learning_rate = 0.5
# A checkpoint every 5 steps saves the epoch's last step (10) twice.
config.train.update(num_epochs=int((sys.argv[7:] or [2])[0]), log_every=5, checkpoint_every=5)
config.parallel.num_devices = 0
for section, values in json.loads((sys.argv[8:] or ['{}'])[0]).items():
  config[section].update(values)
config.generate.update(num_lines=1, num_tokens=5)
try:
  summary, stopped_at = train_and_evaluate(config, workdir), 0
except Preempted as err:
  summary, stopped_at = {}, int(str(err).split(' at step ')[1].split()[0])

corpus = load_data(config)
model = build_model(config.model, len(corpus.vocab))
optimizer = make_optimizer(config.optimizer, config.averaging.trigger)
with Checkpoints(workdir) as checkpoints:  # restored by every process
  state, meta = checkpoints.restore_latest(create_train_state(model, optimizer, config))
params = {
  '/'.join(str(getattr(k, 'key', k)) for k in path): np.asarray(leaf)
  for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
}
# The rows of a global batch [[0], [1], ...] that this process's devices hold.
rows = np.arange(config.data.batch_size)[:, None]
fed = sorted(
  int(row)
  for shard in shard_batch(data_mesh(0), rows)[0].addressable_shards
  for row in np.asarray(shard.data)[:, 0]
)
np.savez(
  out / f'{process_id}.npz',
  rows=np.array(fed),
  step=int(state.step),
  stopped_at=stopped_at,
  summary=json.dumps(summary),
  **{f'params/{k}': v for k, v in params.items()},
)
