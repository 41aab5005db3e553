import sys, pathlib
sys.path.insert(0, 'tests')
from conftest import tiny_lm_config
from lm_zoo.training import train_and_evaluate
from lm_zoo.training.dynamic_evaluation import meta_train_workdir
c = tiny_lm_config(pathlib.Path('/work/shared/data'))
c.data.data_dir = ''
c.model.embed_size = 4
c.model.hidden_size = 4
c.model.mogrifier.rounds = 2
c.model.mogrifier.rank = 2
c.train.num_epochs = 1
c.train.checkpoint_every = 0
c.generate.num_lines = 0
out = pathlib.Path(sys.argv[1])
print(train_and_evaluate(c, out)['valid'])
meta_train_workdir(out, meta_steps=2, num_updates=2, segment_length=3, batch_size=2, hidden=2,
                   fisher_batches=2, fisher_batch_size=2, prior='rms', initial_decay=0.01)
