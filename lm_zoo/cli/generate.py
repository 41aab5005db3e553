"""Generates text from a work directory's best checkpoint
(`lm-zoo-generate`, or `python launch/generate.py`):

  lm-zoo-generate --workdir=runs/x --prompt="the company said" --num_samples=3
  lm-zoo-generate --workdir=runs/x --temperature=0.8 --top_k=50
  lm-zoo-generate --workdir=runs/x --prompt="in the" --beam_width=5
"""

import sys
import warnings

from absl import app, flags

from lm_zoo import cli
from lm_zoo.errors import ConfigError
from lm_zoo.generation import UnknownTokensWarning, check_generation, generate_text
from lm_zoo.runs import load_trained
from lm_zoo.runs.finished import load_model

flags.DEFINE_string(
  'workdir',
  None,
  'A work directory written by lm-zoo-train, or a preset '
  '(lm-zoo-export): its folder, https:// URL or hf://OWNER/NAME.',
  required=True,
)
flags.DEFINE_string(
  'prompt',
  '',
  'Text to continue, tokenised as the corpus is (words '
  'outside the vocabulary become <unk>); empty: start after an '
  'end of sentence.',
)
flags.DEFINE_integer('num_tokens', 30, 'Tokens to generate after the prompt.')
flags.DEFINE_integer('num_samples', 3, 'Sampled continuations (beam search gives one).')
flags.DEFINE_float(
  'temperature',
  1.0,
  'Sampling: logits are divided by it; below 1 is more conservative, near 0 greedy.',
)
flags.DEFINE_integer(
  'top_k', 0, 'Sampling: draw only from the k most likely tokens; 0 draws from all.'
)
flags.DEFINE_integer(
  'beam_width',
  0,
  '> 1: beam search with this many beams, the most likely continuation; 0 or 1: sampling.',
)
flags.DEFINE_integer('seed', 0, 'Sampling seed: the same seed gives the same text.')
flags.DEFINE_string(
  'data_dir',
  None,
  'Data folder to take the vocabulary from (with its '
  "data's check); default: the vocabulary the run saved (WORKDIR/vocab.json).",
)
FLAGS = flags.FLAGS


def _generate_program(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  try:  # before the model loads
    check_generation(
      FLAGS.prompt, FLAGS.num_tokens, FLAGS.num_samples, FLAGS.seed, FLAGS.beam_width
    )
  except ValueError as err:
    raise app.UsageError(f'--{err}') from None
  if FLAGS.beam_width > 1 and (FLAGS.temperature != 1.0 or FLAGS.top_k):
    raise app.UsageError(
      '--temperature and --top_k apply to sampling, not to beam search (--beam_width > 1)'
    )

  def generate():
    if FLAGS.data_dir:
      _, corpus, model, params = load_trained(FLAGS.workdir, FLAGS.data_dir)
      vocab = corpus.vocab
    else:  # the run's own vocabulary: no data needed
      _, vocab, model, params = load_model(FLAGS.workdir)
    try:
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', UnknownTokensWarning)
        texts = generate_text(
          model,
          params,
          vocab,
          FLAGS.prompt,
          FLAGS.num_tokens,
          FLAGS.num_samples,
          FLAGS.seed,
          FLAGS.temperature,
          FLAGS.top_k,
          FLAGS.beam_width,
        )
    except ValueError as err:  # a flag out of range, a word the vocabulary lacks
      raise ConfigError(str(err)) from err
    for warning in caught:  # ours in one line, not Python's two
      if issubclass(warning.category, UnknownTokensWarning):
        print(f'warning: {warning.message}', file=sys.stderr)
      else:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return texts

  for text in cli.run(generate):
    print(text.replace('\n', ' | '))


def main():
  """The `lm-zoo-generate` console script."""
  cli.main(sys.modules[__name__], _generate_program)
