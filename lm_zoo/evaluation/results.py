"""What scoring a text gives: the mean NLL per token and its perplexity or
bits per character; and the mean and spread of a score over seeds."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Mapping, Sequence

import numpy as np

# log of the largest float64: exp of more overflows.
_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def measure(unit: str) -> str:
  """What a paper reports for `unit`: perplexity for words, else bpc."""
  return 'perplexity' if unit == 'word' else 'bpc'


def perplexity(loss: float) -> float:
  """exp(loss) of a mean NLL in nats; infinite where that overflows (a loss
  above about 709.8 nats, which a diverged model or a tiny temperature
  gives), NaN for a NaN loss."""
  if math.isnan(loss):
    return math.nan
  return math.exp(loss) if loss < _LOG_FLOAT_MAX else math.inf


@dataclasses.dataclass(frozen=True)
class EvalResult:
  """Mean NLL in nats per token over `num_tokens` scored tokens, at a
  softmax `temperature`; `details` holds what an evaluator adds (dynamic
  evaluation's settings and per-segment scores, per-token losses)."""

  loss: float
  num_tokens: int
  unit: str = 'word'
  temperature: float = 1.0
  # Left out of the repr: a dynamic evaluation's hold the adapted weights.
  details: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @property
  def perplexity(self) -> float:
    """`perplexity(loss)`: infinite where exp overflows."""
    return perplexity(self.loss)

  @property
  def bits_per_token(self) -> float:
    return self.loss / math.log(2)

  @property
  def measure(self) -> str:
    """What a paper reports for the unit (`measure`)."""
    return measure(self.unit)

  @property
  def figure(self) -> float:
    """The figure a paper reports: the perplexity for words, else the bits
    per character."""
    return self.perplexity if self.unit == 'word' else self.bits_per_token

  def summary(self) -> str:
    if self.unit == 'word':
      return f'perplexity {self.perplexity:.2f}'
    return f'bits per character {self.bits_per_token:.4f}'

  def to_record(self) -> dict[str, Any]:
    """The result as JSON values, details included (their arrays as
    `{'array': values, 'dtype': name}`), which `from_record` reads back
    equal, array dtypes and infinite losses included."""
    fields = dataclasses.asdict(dataclasses.replace(self, details={}))
    return {**fields, 'details': _to_json(dict(self.details))}

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> EvalResult:
    """The result `to_record` wrote; ValueError for a record it could not
    have written."""
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    fields = ('loss', 'num_tokens', 'unit', 'temperature', 'details')
    if not (
      isinstance(record, Mapping)
      and sorted(record) == sorted(fields)
      and number(record['loss'])
      and type(record['num_tokens']) is int
      and record['num_tokens'] >= 0
      and record['unit'] in ('word', 'char')
      and number(record['temperature'])
      and isinstance(record['details'], dict)
    ):
      raise ValueError(f'not a record of EvalResult.to_record: {str(record)[:200]}')
    return cls(**{**record, 'details': _from_json(record['details'])})

  def as_dict(self) -> dict[str, float]:
    return {
      'loss': self.loss,
      'perplexity': self.perplexity,
      'bits_per_token': self.bits_per_token,
      'num_tokens': self.num_tokens,
      'temperature': self.temperature,
    }


def _to_json(value: Any) -> Any:
  if hasattr(value, '__array__'):  # NumPy's and JAX's arrays and scalars
    array = np.asarray(value)
    return {'array': array.tolist(), 'dtype': array.dtype.name}
  if isinstance(value, Mapping):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_to_json(v) for v in value]
  return value


def _from_json(value: Any) -> Any:
  if isinstance(value, dict):
    if set(value) == {'array', 'dtype'}:
      return np.asarray(value['array'], dtype=value['dtype'])
    return {k: _from_json(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_from_json(v) for v in value]
  return value


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (n - 1 in the denominator; nan for
  one value)."""
  values = np.asarray(values, dtype=np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan
