"""Experiments beyond language modelling: each a function config -> result rows."""

from lm_zoo.tasks.adaptive_ff import (build_feedforward, feedforward_spec, run_mnist,
                                      run_tail_regression, tail_regression_data)
from lm_zoo.tasks.reverse_copy import (EncoderDecoder, ReverseCopyData, fit,
                                       reverse_copy_data, run_experiment,
                                       sequence_cross_entropy)

# config.task -> the function that runs it (launch/run_task.py).
TASKS = {
    'reverse_copy': run_experiment,
    'tail_regression': run_tail_regression,
    'mnist': run_mnist,
}

__all__ = ['TASKS', 'EncoderDecoder', 'ReverseCopyData', 'build_feedforward', 'feedforward_spec', 'fit',
           'reverse_copy_data', 'run_experiment', 'run_mnist', 'run_tail_regression',
           'sequence_cross_entropy', 'tail_regression_data']
