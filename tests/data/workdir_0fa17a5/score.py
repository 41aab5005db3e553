import json, sys
from lm_zoo.training import evaluate_workdir
from lm_zoo.training.dynamic_evaluation import dynamic_evaluate_workdir
w = sys.argv[1]
out = {'static': {s: r.loss for s, r in evaluate_workdir(w).items()}}
out['mc_dropout'] = {s: r.loss for s, r in evaluate_workdir(w, mc_samples=3, seed=1).items()}
for method, kw in [('sgd', dict(learning_rates=(0.1,), decays=(0.01,))),
                   ('rms', dict(learning_rates=(0.01,), decays=(0.01,), ms_batches=2, ms_batch_size=2)),
                   ('learned', {})]:
  rep = dynamic_evaluate_workdir(w, method, segment_lengths=(3,), **kw)
  out[method] = {s: r.loss for s, r in rep.results.items()}
print(json.dumps(out, indent=1))
