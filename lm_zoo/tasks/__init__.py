"""Synthetic tasks."""

from lm_zoo.tasks.reverse_copy import EncoderDecoder, ReverseCopyData, reverse_copy_data

__all__ = ['EncoderDecoder', 'ReverseCopyData', 'reverse_copy_data']
