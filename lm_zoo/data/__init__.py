"""Corpora, vocabularies and BPTT batching."""

from lm_zoo.data.batching import BatchedStream, Window, variable_bptt_lengths
from lm_zoo.data.configured import load_data
from lm_zoo.data.corpora import CORPORA, Corpus, load_corpus, resolve_data_dir, split_enwik8
from lm_zoo.data.mnist import load_mnist
from lm_zoo.data.vocab import EOS, Vocab

__all__ = [
  'BatchedStream',
  'CORPORA',
  'Corpus',
  'EOS',
  'Vocab',
  'Window',
  'load_corpus',
  'load_data',
  'load_mnist',
  'resolve_data_dir',
  'split_enwik8',
  'variable_bptt_lengths',
]
