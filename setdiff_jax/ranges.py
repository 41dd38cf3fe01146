"""The allowed values of the settings several launchers take, in one table.

A setting such as top_p is given as `launch/sample.py --top_p`, `launch/evaluate.py --top_p` and
`rl.top_p` of an RL config; each reads its range from `SHARED` here, so all of them accept and
refuse the same values with the same words. The run config's own table
(`workdir/config.FIELD_RANGES`) builds on the same `Range` / `Choice` types and takes the shared
fields from here. Bounds that depend on the run (window <= seq_len, a saved step) are checked
where the run is known.

  ranges.check("top_p", 1.5, "--top_p")   # ValueError: --top_p=1.5 is out of range; allowed: ...
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple


class Range(NamedTuple):
  """Allowed values of a numeric field: lo <= v (< or <=) hi, plus `also` (e.g. -1 = all)."""

  kind: type  # int or float (an int is accepted for a float field)
  lo: Optional[float] = None
  hi: Optional[float] = None
  lo_open: bool = False
  hi_open: bool = False
  also: Tuple = ()

  def ok(self, v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float) if self.kind is float else int):
      return False
    if v in self.also:
      return True
    lo_ok = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
    hi_ok = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
    return bool(lo_ok and hi_ok)  # NaN fails both

  def describe(self) -> str:
    fmt = (lambda v: str(int(v))) if self.kind is int else (lambda v: f"{v:g}")  # noqa: E731
    lo = "-inf" if self.lo is None else fmt(self.lo)
    hi = "inf" if self.hi is None else fmt(self.hi)
    text = (
      f"{'an integer' if self.kind is int else 'a number'} in "
      f"{'(' if self.lo_open or self.lo is None else '['}{lo}, {hi}"
      f"{')' if self.hi_open or self.hi is None else ']'}"
    )
    return text + "".join(f" or {a}" for a in self.also)

  def with_also(self, *values) -> "Range":
    """The same range plus sentinel values (e.g. 0 = "the default" in a config field)."""
    return self._replace(also=tuple(self.also) + tuple(values))


class Choice(NamedTuple):
  """Allowed values of a field with a fixed set of choices (strings, or True / False)."""

  values: Tuple

  def ok(self, v) -> bool:
    return any(
      v is c if isinstance(c, bool) or c is None else (v == c and not isinstance(v, bool))
      for c in self.values
    )

  def describe(self) -> str:
    return "one of " + ", ".join(repr(c) if isinstance(c, str) else str(c) for c in self.values)


def integer(lo=None, hi=None, also=()) -> Range:
  return Range(int, lo, hi, also=also)


def number(lo=None, hi=None, lo_open=False, hi_open=False, also=()) -> Range:
  return Range(float, lo, hi, lo_open, hi_open, also)


# Settings taken by more than one launcher (sample, evaluate, RL, export, train). A launcher's
# "unset" value (None for a flag, 0 for some config fields) is not part of the range.
SHARED = {
  "seed": integer(0, 2**32 - 1),  # PRNG seeds (launch/sample.py also takes -1: a random one)
  "step": integer(0),  # a checkpoint step (it must also exist)
  "window": integer(1),  # set-sampler W (also <= seq_len)
  "max_new_tokens": integer(1),  # tokens to generate (also < seq_len)
  "threshold": number(0, 1, lo_open=True),  # confidence tau (unset / 'off': none)
  "top_p": number(0, 1, lo_open=True),
  "temperature": number(0, lo_open=True),
  "repetition_penalty": number(0, lo_open=True),  # 1 = off
  "batch_size": integer(1),
  "num_samples": integer(1),
}


def check(field: str, value, name: Optional[str] = None, also: Tuple = ()):
  """Raises ValueError naming `name` (e.g. '--top_p', 'rl.top_p'; default the field) unless
  `value` is in `SHARED[field]` (or one of `also`)."""
  allowed = SHARED[field].with_also(*also) if also else SHARED[field]
  if not allowed.ok(value):
    raise ValueError(
      f"{name or field}={value!r} is out of range; allowed: {allowed.describe()} (the same "
      f"range for every launcher that takes {field})"
    )


__all__ = ["Range", "Choice", "integer", "number", "SHARED", "check"]
