"""Did a rerun reproduce an earlier record? Two records of one benchmark compared value by value.

    python -m setdiff_jax.experiments.reproduce OLD NEW   # record names (or paths to their JSON)

A record's *measured values* are its JSON leaves except
- its identity: name, commit, command, date, device, measured paths, provenance, the rendered
  markdown, and any string naming a path or the record itself (output folders differ per run);
- its timings: every leaf under a key that names a time, a rate or the machine's load (seconds,
  tok/s, rows/s, load, ...): they move with the machine's load, so they are
  summarised as the median ratio NEW / OLD, never required to be equal.

The two reproduce each other when both hold the same measured leaves and every one is equal
(numbers to a relative 1e-9: JSON round trips, nothing more). On a CPU our training and decoding
are deterministic given the seeds, so a rerun of an accuracy benchmark on the same kind of machine
is expected to give every per-problem outcome again; one that does not shows the code changed
what it measures. `publish` runs this for each record against the one before it in its series
(`name`, `name_r2`, `name_r3`, ...) when both ran the same command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import statistics
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

IDENTITY_KEYS = frozenset(
  {"name", "commit", "command", "date", "device", "hardware", "measured_paths", "provenance"}
  | {"markdown", "commit_note", "records_note", "sft_note", "why_kept"}
)
# Scalars that say which inputs ran (the commit that trained a checkpoint read here), at any depth.
NESTED_IDENTITY = frozenset({"commit", "date", "command", "refs"})
TIMING_KEY = re.compile(r"second|minutes|(^|_)s$|/s\b|per_s|load|wall|^official$|^ours$", re.I)
DURATION_KEY = re.compile(r"second|minutes|(^|_)s$|wall", re.I)  # not a rate (per_s, tok/s)
# Flags whose value is where a run wrote or read its files (or the record's name): two runs of
# one command differ there and nowhere else.
# `runs` / `refs`: the names of the records an aggregate reads (`compare_seeds`), which a rerun
# of the aggregate names anew (x_s0 -> x_s0_r2).
PLACE_FLAGS = frozenset(
  {"record", "out", "output", "output_dir", "results_dir", "workdir", "tuned_dirs"}
  | {"sft_workdirs", "official_dir", "official_python", "runs"}
)
SERIES_SUFFIX = re.compile(r"_r(\d+)$")


@dataclasses.dataclass
class Comparison:
  """What `compare(old, new)` found. `differ`: (path, old, new) of measured leaves that differ;
  `only_old` / `only_new`: paths present in one record only; `timing_ratio`: median NEW / OLD
  over the durations both hold (seconds: above 1 the rerun was slower; rates are left out of it,
  they move the other way; None without any); `other_device`: the records name
  different CPUs or accelerators (floats may then differ in their last bits)."""

  measured: int
  differ: List[Tuple[str, Any, Any]]
  only_old: List[str]
  only_new: List[str]
  timing_ratio: Optional[float]
  timings: int
  other_device: bool = False

  @property
  def identical(self) -> bool:
    return self.measured > 0 and not (self.differ or self.only_old or self.only_new)

  def summary(self, old: str) -> str:
    """One sentence, e.g. "every one of the 1,284 values (timings apart) equals
    `tuned_arithmetic_r2`'s"; `old` names the earlier record as the sentence should."""
    if self.identical:
      text = f"every one of the {self.measured:,} values (timings apart) equals {old}'s"
    else:
      parts = []
      if self.differ:
        path, a, b = self.differ[0]
        parts.append(
          f"{len(self.differ):,} of the {self.measured:,} values (timings apart) differ from "
          f"{old}'s (first: `{path}` {_short(a)} -> {_short(b)})"
        )
      if self.only_old:
        parts.append(f"{len(self.only_old):,} only in {old} (first: `{self.only_old[0]}`)")
      if self.only_new:
        parts.append(f"{len(self.only_new):,} only in the rerun (first: `{self.only_new[0]}`)")
      text = "; ".join(parts) if parts else f"no values (timings apart) to compare with {old}'s"
    if self.other_device:
      text += " (on another device)"
    if self.timing_ratio is not None:
      text += f"; the rerun's durations x{self.timing_ratio:.2f} (median ratio of {self.timings:,})"
    return text


def _short(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 40 else text[:37] + "..."


def _is_place(value: Any, names: Tuple[str, ...]) -> bool:
  return isinstance(value, str) and (value.startswith("/") or value in names)


def leaves(record: Dict[str, Any]) -> Iterator[Tuple[str, bool, Any]]:
  """(path, kind, value) of every leaf outside the record's identity; kind: "value", "duration"
  (under a key naming a time) or "rate" (tok/s, load: also a timing, not a duration), e.g.
  ("outcomes.ar.0[0].values[3]", False, 1.0)."""
  names = tuple(n for n in (record.get("name"), (record.get("args") or {}).get("record")) if n)

  def walk(obj, path: str, kind: str):
    if isinstance(obj, dict):
      for key, value in obj.items():
        key = str(key)
        if key in NESTED_IDENTITY or (key in PLACE_FLAGS and not isinstance(value, (dict, list))):
          continue
        sub = f"{path}.{key}" if path else key
        inner = kind
        if TIMING_KEY.search(key):
          inner = "duration" if DURATION_KEY.search(key) else "rate"
        yield from walk(value, sub, inner)
    elif isinstance(obj, list):
      for i, value in enumerate(obj):
        yield from walk(value, f"{path}[{i}]", kind)
    elif not _is_place(obj, names):
      yield path, kind, obj

  top = {k: v for k, v in record.items() if k not in IDENTITY_KEYS}
  yield from walk(top, "", "value")


def _equal(a: Any, b: Any) -> bool:
  if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)):
    return a == b
  if not isinstance(b, (int, float)):
    return False
  if math.isnan(a) or math.isnan(b):
    return math.isnan(a) and math.isnan(b)
  return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or a == b


def _device(record: Dict[str, Any]) -> Tuple[Any, ...]:
  hw = record.get("device") or record.get("hardware") or {}
  hw = hw if isinstance(hw, dict) else {"device": hw}
  return tuple(hw.get(k) for k in ("cpu", "backend", "device", "num_devices"))


def compare(old: Dict[str, Any], new: Dict[str, Any]) -> Comparison:
  """Every measured leaf of `old` against `new` (see the module docstring)."""
  a = {p: (t, v) for p, t, v in leaves(old)}
  b = {p: (t, v) for p, t, v in leaves(new)}
  measured, differ, ratios = 0, [], []
  for path in a.keys() & b.keys():
    (kind, va), (_, vb) = a[path], b[path]
    if kind != "value":
      numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
      if kind == "duration" and numbers and va and math.isfinite(va) and math.isfinite(vb):
        ratios.append(vb / va)
      continue
    measured += 1
    if not _equal(va, vb):
      differ.append((path, va, vb))
  untimed = lambda d, keys: sorted(p for p in keys if d[p][0] == "value")  # noqa: E731
  return Comparison(
    measured=measured,
    differ=sorted(differ),
    only_old=untimed(a, a.keys() - b.keys()),
    only_new=untimed(b, b.keys() - a.keys()),
    timing_ratio=statistics.median(ratios) if ratios else None,
    timings=len(ratios),
    other_device=_device(old) != _device(new),
  )


def series(name: str) -> Tuple[str, int]:
  """(the series' first name, this record's place in it): "x_r3" -> ("x", 3), "x" -> ("x", 1)."""
  m = SERIES_SUFFIX.search(name)
  return (name[: m.start()], int(m.group(1))) if m else (name, 1)


def program_words(word: str) -> List[str]:
  """`benchmarks/x.py` -> ["-m", "benchmarks.x"] (how every benchmark is run); other words as they
  are."""
  if word.endswith(".py") and "/" in word and not word.startswith("-"):
    return ["-m", word[: -len(".py")].replace("/", ".")]
  return [word]


def command_key(command: str) -> Tuple[str, ...]:
  """The command without where it wrote (PLACE_FLAGS), its flags in sorted order and
  `python benchmarks/x.py` read as `python -m benchmarks.x`: two runs of one experiment give the
  same key (flags are written as `--flag=value`, as every benchmark's usage line shows)."""
  try:
    words = shlex.split(command or "")
  except ValueError:
    words = (command or "").split()
  program, flags = [], []
  for w in words:
    if w.startswith("--"):
      if w[2:].split("=", 1)[0] not in PLACE_FLAGS:
        flags.append(w)
    else:
      program += program_words(w)
  return tuple(program + sorted(flags))


def predecessors(records: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
  """{name: the record before it in its series}, for records whose predecessor ran the same
  command (`command_key`)."""
  by_series: Dict[str, List[Tuple[int, str]]] = {}
  for name in records:
    base, place = series(name)
    by_series.setdefault(base, []).append((place, name))
  out = {}
  for members in by_series.values():
    members.sort()
    for (_, before), (_, name) in zip(members, members[1:]):
      if command_key(records[before].get("command")) == command_key(records[name].get("command")):
        out[name] = before
  return out


def _load(arg: str) -> Tuple[str, Dict[str, Any]]:
  path = arg if arg.endswith(".json") else os.path.join("benchmarks", "results", f"{arg}.json")
  with open(path) as f:
    return os.path.basename(path)[: -len(".json")], json.load(f)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("old", help="the earlier record: a name in benchmarks/results or a JSON path")
  ap.add_argument("new", help="the rerun")
  ap.add_argument("--show", type=int, default=10, help="how many differing values to list")
  args = ap.parse_args(argv)
  try:
    (old_name, old), (_, new) = _load(args.old), _load(args.new)
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  result = compare(old, new)
  print(result.summary(f"`{old_name}`"))
  for path, a, b in result.differ[: args.show]:
    print(f"  {path}: {_short(a)} -> {_short(b)}")
  return 0 if result.identical else 1


if __name__ == "__main__":
  sys.exit(main())
