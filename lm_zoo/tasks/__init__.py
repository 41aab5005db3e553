"""Synthetic tasks."""

from lm_zoo.tasks.reverse_copy import (EncoderDecoder, ReverseCopyData, fit,
                                       reverse_copy_data, run_experiment,
                                       sequence_cross_entropy)

__all__ = ['EncoderDecoder', 'ReverseCopyData', 'fit', 'reverse_copy_data', 'run_experiment',
           'sequence_cross_entropy']
