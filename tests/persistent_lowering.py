"""What the persistent kernels' tests (test_persistent_lstm.py,
test_persistent_lstm_backward.py) check of a kernel lowered for CUDA in each
of `lm_zoo.kernels.grid_barrier.MODES`."""

FENCE = 'fence.proxy.async.global'


def check_lowered_modes(lowered):
  """`lowered(mode)`: the module's text. The persistent form has the global
  semaphore (an int32 scratch; a release add and a polling load) and the
  proxy fences; the unfenced form the semaphore without the fences; the
  barrier-free form neither; the per-step form is a loop of launches."""
  modes = ('persistent', 'unfenced', 'no_barrier', 'per_step')
  persistent, unfenced, free, per_step = (lowered(mode) for mode in modes)
  assert 'stablehlo.while' in per_step and 'stablehlo.while' not in persistent
  for text in (persistent, free, per_step):
    assert '@mosaic_gpu' in text and 'tensor<64x' in text
  assert 'tensor<1xi32>' in persistent and 'red.release' in persistent
  assert 'ld.relaxed' in persistent
  assert 'tensor<1xi32>' not in free and 'red.release' not in free
  assert FENCE in persistent and 'red.release' in unfenced and FENCE not in unfenced
