"""Allowed values of settings: the `Range` / `Choice` types, the settings several launchers share,
and `setting` / `Section`, from which the typed run config (`config/sections.py`) is declared.

A setting such as top_p is given as `launch/sample.py --top_p`, `launch/evaluate.py --top_p` and
`rl.top_p` of an RL config; each reads its range from `SHARED` here, so all of them accept and
refuse the same values with the same words. Each field of a run-config section carries its own
range (`setting(default, allowed)`) and a section checks them when it is built. Bounds that depend
on the run (window <= seq_len, a saved step) are checked where the run is known.

  fields.check("top_p", 1.5, "--top_p")   # ValueError: --top_p=1.5 is out of range; allowed: ...
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union


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
    if not math.isfinite(v):  # inf (and nan) of an unbounded side, e.g. a learning rate
      return False
    lo_ok = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
    hi_ok = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
    return bool(lo_ok and hi_ok)

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
  # below 1e-4 it is argmax (use --greedy): z / T then overflows fp32 inside the jitted softmax
  # (T = 1e-12 drew PAD everywhere on a real run)
  "temperature": number(1e-4),
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


BOOL = Choice((True, False))


def setting(
  default, allowed: Union[Range, Choice, None] = None, *, key: str = "", none_type: type = str
):
  """A section field: its default, its allowed values (None: free-form, checked where it is
  used), its dotted name in the ConfigDict when that is not `<section prefix>.<name>`, and the
  type a None default takes in the ConfigDict (so `--config.<key>=` can set it)."""
  return dataclasses.field(
    default=default, metadata={"allowed": allowed, "key": key, "none_type": none_type}
  )


def out_of_range(key: str, value, allowed) -> ValueError:
  return ValueError(
    f"invalid config: {key}={value!r} is out of range; allowed: {allowed.describe()} "
    f"(set --config.{key})"
  )


class Section:
  """Base of a frozen dataclass of run-config fields declared with `setting`. `PREFIX` is the
  section's name in the ConfigDict ("" for top-level fields). Building one checks every field
  against its range (one error line naming `--config.<key>`)."""

  PREFIX = ""

  @classmethod
  def key(cls, field: dataclasses.Field) -> str:
    return field.metadata.get("key") or (f"{cls.PREFIX}.{field.name}" if cls.PREFIX else field.name)

  @classmethod
  def ranges(cls) -> Dict[str, Any]:
    """{ConfigDict key: allowed values} of the fields that have a range."""
    return {
      cls.key(f): f.metadata["allowed"]
      for f in dataclasses.fields(cls)
      if f.metadata.get("allowed") is not None
    }

  @classmethod
  def free_fields(cls) -> Tuple[str, ...]:
    """ConfigDict keys of the free-form fields (paths, names, rules)."""
    return tuple(cls.key(f) for f in dataclasses.fields(cls) if f.metadata.get("allowed") is None)

  @classmethod
  def from_config_dict(cls, config):
    """The section of `config` (a ConfigDict or dict); fields it lacks (an older config.json)
    take their defaults."""
    values = {}
    for f in dataclasses.fields(cls):
      found = lookup(config, cls.key(f))
      if found is not MISSING:
        values[f.name] = found
    return cls(**values)

  def skip_range_check(self, name: str, value) -> bool:
    """Whether a field's value is exempt from its range (a sentinel a rule between sections
    resolves); none by default."""
    del name, value
    return False

  def __post_init__(self):
    for f in dataclasses.fields(self):
      allowed, value = f.metadata.get("allowed"), getattr(self, f.name)
      if allowed is not None and not self.skip_range_check(f.name, value) and not allowed.ok(value):
        raise out_of_range(self.key(f), value, allowed)


MISSING = object()


def lookup(config, key: str):
  """`config[a][b]` for key 'a.b', or MISSING if a level lacks it."""
  node = config
  for part in key.split("."):
    node = node.get(part, MISSING) if hasattr(node, "get") else MISSING
    if node is MISSING:
      return MISSING
  return node


__all__ = [
  "Range",
  "Choice",
  "integer",
  "number",
  "SHARED",
  "check",
  "BOOL",
  "setting",
  "out_of_range",
  "Section",
  "MISSING",
  "lookup",
]
