"""Hostile command lines through lm-zoo-train, lm-zoo-eval and
lm-zoo-generate: absl's flags, the --config files and their --config.FIELD
overrides, damaged or misplaced files. Each ends in a one-line error that
names the flag or file (exit status 1, no traceback anywhere in the output)
or in a correct result (tests/hostile_programs.py runs them)."""

import pytest
from hostile_programs import LONG_PROMPT, TINY_FLAGS, check, run_probes

# id -> (program, its flags ({t}, {w}, {d} filled in), what stderr's error line
# says; None where the command must succeed)
PROBES = {
  # lm-zoo-train
  'train: a hidden size that is no number': (
    'train',
    ['--workdir={t}/a', '--config.model.hidden_size=abc'],
    "--config.model.hidden_size: invalid literal for int() with base 10: 'abc'",
  ),
  'train: a float hidden size': (
    'train',
    ['--workdir={t}/a', '--config.model.hidden_size=1.5'],
    "--config.model.hidden_size: invalid literal for int() with base 10: '1.5'",
  ),
  'train: a negative dropout': (
    'train',
    ['--workdir={t}/a', '--config.model.dropout_input=-0.1'],
    'config field model.dropout_input=-0.1 must be in [0, 1)',
  ),
  'train: a NaN dropout': (
    'train',
    ['--workdir={t}/a', '--config.model.dropout_output=nan'],
    'config field model.dropout_output=nan must be in [0, 1)',
  ),
  'train: a zero batch': (
    'train',
    ['--workdir={t}/a', '--config.data.batch_size=0'],
    'config field data.batch_size=0 must be at least 1 (--config.data.batch_size)',
  ),
  'train: an infinite learning rate': (
    'train',
    ['--workdir={t}/a', '--config.optimizer.learning_rate=inf'],
    'config field optimizer.learning_rate=inf must be finite (--config.optimizer.learning_rate)',
  ),
  'train: an unknown dtype string': (
    'train',
    ['--workdir={t}/a', '--config.model.dtype=fp8'],
    "model.dtype='fp8' is not known: choose one of float32, bfloat16",
  ),
  'train: a negative seed': (
    'train',
    ['--workdir={t}/a', '--config.seed=-1'],
    'config field seed=-1 must be in [0, 2**32) (a PRNG seed) (--config.seed)',
  ),
  'train: a negative epoch count': (
    'train',
    ['--workdir={t}/a', '--config.train.num_epochs=-1'],
    'train.num_epochs=-1 must be at least 1',
  ),
  'train: logs every -1 steps': (
    'train',
    ['--workdir={t}/a', '--config.train.log_every=-1'],
    'train.log_every=-1 must be at least 1',
  ),
  'train: a data folder that is a file': (
    'train',
    ['--workdir={t}/a', '--config.data.data_dir={t}/file.txt'],
    'data folder {t}/file.txt is a file, not a folder',
  ),
  'train: a config file with a syntax error': (
    'train',
    ['--config={t}/syntax.py'],
    '--config={t}/syntax.py does not load (SyntaxError: invalid syntax (syntax.py, line 1))',
  ),
  'train: a config file without get_config': (
    'train',
    ['--config={t}/no_get_config.py'],
    '--config={t}/no_get_config.py does not load (AttributeError',
  ),
  'train: a config file that raises': (
    'train',
    ['--config={t}/raises.py'],
    '--config={t}/raises.py does not load (ZeroDivisionError: division by zero)',
  ),
  'train: a folder as the config file': (
    'train',
    ['--config={t}/empty_dir'],
    '--config={t}/empty_dir does not load (OSError: Configuration is not available '
    "because of an earlier failure to load: [Errno 21] Is a directory: '{t}/empty_dir')",
  ),
  'train: a JSON file as the config file': (
    'train',
    ['--config={t}/list.json'],
    '--config={t}/list.json does not load (AttributeError',
  ),
  'train: a variant of a config without variants': (
    'train',
    ['--config=experiments/default.py:big'],
    '--config: TypeError: get_config() takes 0 positional arguments but 1 was given',
  ),
  'train: an empty dataset name': (
    'train',
    ['--workdir={t}/a', '--config.data.name='],
    "data.name='' is not known: choose one of ptb",
  ),
  'train: a stray argument': (
    'train',
    ['--workdir={t}/a', 'extra'],
    'error: unexpected arguments: extra',
  ),
  'train: --seeds not a number': (
    'train',
    ['--workdir={t}/a', '--seeds=two'],
    "--seeds: invalid literal for int() with base 10: 'two'",
  ),
  'train: an empty workdir': (
    'train',
    ['--workdir='],
    'the work directory is empty: name a folder for the run (--workdir=runs/NAME)',
  ),
  'train: a workdir that is a file': (
    'train',
    ['--workdir={t}/file.txt'],
    '--workdir={t}/file.txt is a file, not a folder',
  ),
  'train: init_from a file': (
    'train',
    ['--workdir={t}/a', '--config.train.init_from={t}/file.txt'],
    'train.init_from={t}/file.txt is not a work directory of lm-zoo-train',
  ),
  'train: negative train tokens': (
    'train',
    ['--workdir={t}/a', '--config.data.train_tokens=-1'],
    'config field data.train_tokens=-1 must be >= 0',
  ),
  'train: a seed of 10**23': (
    'train',
    ['--workdir={t}/a', '--config.seed=100000000000000000000000'],
    'config field seed=100000000000000000000000 must be in [0, 2**32)',
  ),
  'train: a hidden size of 2**40': (
    'train',
    ['--workdir={t}/a', '--config.model.hidden_size=1099511627776'],
    'model.hidden_size=1099511627776 must be below 2**31',
  ),
  'train: a hidden size too large for the memory': (
    'train',
    ['--workdir={t}/a', '--config.model.hidden_size=300000'],
    'model.hidden_size=300000 gives 1 x ',
  ),
  'train: a unicode, spaced work directory trains': (
    'train',
    [*TINY_FLAGS, '--config.data.data_dir={d}', '--workdir={t}/rün ✓ x'],
    None,
  ),
  # lm-zoo-eval
  'eval: no --workdir': (
    'evaluate',
    [],
    '--workdir: Flag --workdir must have a value other than None.',
  ),
  'eval: a workdir that is a file': (
    'evaluate',
    ['--workdir={t}/file.txt'],
    '{t}/file.txt/config.json not found: is {t}/file.txt a work directory',
  ),
  'eval: an empty vocab.json': ('evaluate', ['--workdir={t}/_empty_vocab'], None),
  'eval: a vocab.json of the wrong shape': (
    'evaluate',
    ['--workdir={t}/_vocab_of_wrong_shape'],
    None,
  ),
  'eval: a config.json that is a list': (
    'evaluate',
    ['--workdir={t}/_config_a_list'],
    '{t}/_config_a_list/config.json holds no config (a JSON list): restore it',
  ),
  'eval: a config.json that is a folder': (
    'evaluate',
    ['--workdir={t}/_config_a_folder'],
    '{t}/_config_a_folder/config.json not found',
  ),
  'eval: best/ a file': (
    'evaluate',
    ['--workdir={t}/_best_a_file'],
    'no best checkpoint in {t}/_best_a_file/best',
  ),
  'eval: best/ missing': (
    'evaluate',
    ['--workdir={t}/_no_best'],
    'no best checkpoint in {t}/_no_best/best',
  ),
  'eval: an unknown field in config.json': (
    'evaluate',
    ['--workdir={t}/_unknown_config_field'],
    'config.json has fields this lm_zoo does not know: model.hiden_size',
  ),
  'eval: an unknown section in config.json': (
    'evaluate',
    ['--workdir={t}/_unknown_config_section'],
    'config.json has fields this lm_zoo does not know: extras',
  ),
  'eval: an empty data.json object': (
    'evaluate',
    ['--workdir={t}/_data_json_empty_object'],
    '{t}/_data_json_empty_object/data.json has the fingerprint',
  ),
  'eval: a training config as --config': (
    'evaluate',
    ['--workdir={w}', '--config=experiments/default.py'],
    None,
  ),
  'eval: temperature 0': (
    'evaluate',
    ['--workdir={w}', '--config.static.temperature=0'],
    'static.temperature must be a positive number, got 0.0',
  ),
  'eval: temperature -inf': (
    'evaluate',
    ['--workdir={w}', '--config.static.temperature=-inf'],
    'static.temperature must be a positive number, got -inf',
  ),
  'eval: an unknown split': (
    'evaluate',
    ['--workdir={w}', '--config.splits=trian'],
    "splits: unknown split 'trian'; choose from train, valid, test",
  ),
  'eval: negative max_tokens': (
    'evaluate',
    ['--workdir={w}', '--config.max_tokens=-3'],
    'max_tokens must be a whole number >= 0 (0: the default), got -3',
  ),
  'eval: zero MC dropout samples': (
    'evaluate',
    [
      '--workdir={w}',
      '--config=experiments/evaluate.py:mc_dropout',
      '--config.mc_dropout.samples=0',
    ],
    'mc_dropout.samples must be a whole number >= 1, got 0',
  ),
  'eval: a NaN dynamic learning rate': (
    'evaluate',
    ['--workdir={w}', '--config=experiments/dyneval_sgd.py', '--config.dynamic.learning_rate=nan'],
    "dynamic.learning_rate must be one or more numbers >= 0, got ('nan',)",
  ),
  'eval: a data folder that does not exist': (
    'evaluate',
    ['--workdir={w}', '--data_dir={t}/nope'],
    'data folder {t}/nope does not exist',
  ),
  'eval: --output a folder': (
    'evaluate',
    ['--workdir={w}', '--output={t}/empty_dir'],
    '--output={t}/empty_dir is a folder: give --output=FILE in a folder you can write',
  ),
  'eval: --output under a file': (
    'evaluate',
    ['--workdir={w}', '--output={t}/file.txt/x.json'],
    '--output={t}/file.txt/x.json cannot be written (File exists)',
  ),
  'eval: no split': (
    'evaluate',
    ['--workdir={w}', '--config.splits='],
    'splits is empty: name one or more of train, valid, test',
  ),
  'eval: a batch of more rows than the split has tokens': (
    'evaluate',
    ['--workdir={w}', '--config.batch_size=10000000'],
    'tokens, fewer than batch_size 10,000,000 rows: lower batch_size',
  ),
  'eval: a negative batch size': (
    'evaluate',
    ['--workdir={w}', '--config.batch_size=-2'],
    'batch_size must be a whole number >= 0 (0: the default), got -2',
  ),
  # lm-zoo-generate
  'generate: temperature 0': (
    'generate',
    ['--workdir={w}', '--temperature=0'],
    'temperature must be a positive number, got 0.0',
  ),
  'generate: temperature NaN': (
    'generate',
    ['--workdir={w}', '--temperature=nan'],
    'temperature must be a positive number, got nan',
  ),
  'generate: temperature inf': (
    'generate',
    ['--workdir={w}', '--temperature=inf'],
    'temperature must be a positive number, got inf',
  ),
  'generate: a negative top_k': (
    'generate',
    ['--workdir={w}', '--top_k=-1'],
    'top_k must be at least 0, got -1',
  ),
  'generate: top_k past the vocabulary': ('generate', ['--workdir={w}', '--top_k=100000000'], None),
  'generate: beams past the vocabulary': (
    'generate',
    ['--workdir={w}', '--beam_width=100000'],
    'beam_width must be from 1 to 10,000, got 100,000',
  ),
  'generate: -5 tokens': (
    'generate',
    ['--workdir={w}', '--num_tokens=-5'],
    'error: --num_tokens must be from 1 to 10,000, got -5',
  ),
  'generate: 10**8 tokens': (
    'generate',
    ['--workdir={w}', '--num_tokens=100000000'],
    'error: --num_tokens must be from 1 to 10,000, got 100,000,000',
  ),
  'generate: no samples': (
    'generate',
    ['--workdir={w}', '--num_samples=0'],
    'error: --num_samples must be from 1 to 1,024, got 0',
  ),
  'generate: a beam width of -2': (
    'generate',
    ['--workdir={w}', '--beam_width=-2'],
    'error: --beam_width must be at least 0, got -2',
  ),
  'generate: a seed past 2**32': (
    'generate',
    ['--workdir={w}', '--seed=4294967296'],
    'error: --seed must be from 0 to 4,294,967,295, got 4,294,967,296',
  ),
  'generate: --num_tokens not a number': (
    'generate',
    ['--workdir={w}', '--num_tokens=ten'],
    "--num_tokens: invalid literal for int() with base 10: 'ten'",
  ),
  'generate: a prompt of control characters and unicode': (
    'generate',
    ['--workdir={w}', '--prompt=\x01\x07 ünï 😀 \t the', '--num_tokens=3', '--num_samples=1'],
    None,
  ),
  'generate: a prompt of 5000 words': (
    'generate',
    ['--workdir={w}', LONG_PROMPT, '--num_tokens=2', '--num_samples=1'],
    None,
  ),
  'generate: a data folder without the corpus': (
    'generate',
    ['--workdir={w}', '--data_dir={t}/empty_dir'],
    "corpus folder {t}/empty_dir/ptb is missing: corpus 'ptb' expects it under the "
    'data folder; fetch it with lm-zoo-download --data_dir={t}/empty_dir --datasets=ptb, '
    'or name the data folder that holds it (LM_ZOO_DATA for every program, or '
    "lm-zoo-train --config.data.data_dir, the other programs' --data_dir",
  ),
  'generate: beam search with a temperature': (
    'generate',
    ['--workdir={w}', '--beam_width=3', '--temperature=0.5'],
    'error: --temperature and --top_k apply to sampling, not to beam search',
  ),
}


@pytest.fixture(scope='module')
def outcomes(hostile_folders):
  return run_probes(PROBES, hostile_folders)


@pytest.mark.parametrize('probe', PROBES)
def test_a_hostile_command_line_is_one_error_line_or_a_result(probe, outcomes, hostile_folders):
  check(outcomes[probe], PROBES[probe][2], hostile_folders)
