"""Did a rerun reproduce an earlier record? Two records of one benchmark compared value by value.

    python -m setdiff_jax.experiments.reproduce OLD NEW   # record names (or paths to their JSON)

A record's *measured values* are its JSON leaves except
- its identity: name, commit, command, date, device, measured paths, provenance, the rendered
  markdown, its seal; at any depth the commit, date, command and folder (`workdir`, `dir`) of what it read;
  the benchmark's flags that name where it wrote or read (`--output_dir`, `--record`, ...; at the
  top level and under `args` only: a decoded `output` deeper down is data), and any string
  equal to the record's own name;
- its timings: every leaf under a key that names a rate (tokens_per_second, rows_per_s, tok/s,
  the machine's load) or a duration (train_seconds, median_s, wait_minutes, `timings`), matched
  word by word (`per_seed`, `tokens_per_step` are measured values): they move with the machine's
  load, so the durations are summarised as the median ratio NEW / OLD, never required equal.

The two reproduce each other when both hold the same measured leaves and every one is equal
(booleans, strings and integers exactly, floats to a relative 1e-9: JSON round trips, nothing
more). On a CPU our training and decoding are deterministic given the seeds, so a rerun of an
accuracy benchmark on the same kind of machine is expected to give every per-problem outcome
again; one that does not shows the code changed what it measures. `publish` runs this for each
record against the latest earlier record of its series (`name`, `name_r2`, `name_r3`, ...) that
ran the same command.

A record's command is read here too: `command_key` (what makes two runs one experiment) and
`benchmark_flags` (the flags its benchmark parses, asked of its argparse parser without running
it; `rerun` refuses a `--set` of any other before it makes a worktree).
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
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

from setdiff_jax.experiments import git, record

IDENTITY_KEYS = frozenset(
  {"name", "commit", "command", "date", "device", "hardware", "measured_paths", "provenance"}
  | {"markdown", "commit_note", "records_note", "sft_note", "why_kept", "seal"}
)
# Keys that say which inputs ran or where they live (the commit that trained a checkpoint read
# here, its folder), at any depth.
NESTED_IDENTITY = frozenset({"commit", "date", "command", "refs", "workdir", "dir"})
# The benchmark's flags whose value is where a run wrote or read its files (or the record's
# name): two runs of one command differ there and nowhere else. Only the flags themselves (the
# record's top level and its `args`) are set aside: the same word deeper down is data (a decoded
# `output`). `runs` / `refs`: the names of the records an aggregate reads (`compare_seeds`),
# which a rerun of the aggregate names anew (x_s0 -> x_s0_r2).
PLACE_FLAGS = frozenset(
  {"record", "out", "output", "output_dir", "results_dir", "workdir", "tuned_dirs"}
  | {"sft_workdirs", "official_dir", "official_python", "runs"}
)
FLAG_SECTIONS = ((), ("args",))
# Timings, matched word by word (`per_seed`, `tokens_per_step` are measured values): a rate
# (tokens_per_second, rows_per_s, tok/s, the machine's load, the official-vs-ours rate columns)
# or a duration (train_seconds, median_s, wait_minutes, wall_..., RunRecord's `timings`).
RATE_KEY = re.compile(r"per_s(econd)?($|_)|/s\b|(^|_)load($|_)|^(official|ours)$", re.I)
DURATION_KEY = re.compile(r"(^|_)(seconds|minutes|s)($|_)|(^|_)wall($|_)|^timings$", re.I)
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


def _is_name(value: Any, names: Tuple[str, ...]) -> bool:
  return isinstance(value, str) and value in names


def _is_place_flag(key: str, value: Any, section: Tuple[Any, ...]) -> bool:
  """A flag naming a place (PLACE_FLAGS) at the top level or in `args`, holding a path, a name or
  a list of them (a list of records' data, e.g. an aggregate's `runs`, is compared)."""
  if key not in PLACE_FLAGS or section not in FLAG_SECTIONS:
    return False
  if isinstance(value, list):
    return all(v is None or isinstance(v, str) for v in value)
  return value is None or isinstance(value, str)


def path_text(path: Tuple[Any, ...]) -> str:
  """("a", "0.001", 3) -> 'a["0.001"][3]': dict keys joined by dots unless they hold one (or a
  bracket), list indices in brackets; two different paths never read the same."""
  out = ""
  for part in path:
    if isinstance(part, int):
      out += f"[{part}]"
    elif part and all(c.isalnum() or c in "_-/ " for c in part) and not part[0].isdigit():
      out += f".{part}" if out else part
    else:
      out += f"[{json.dumps(part)}]"
  return out


def leaves(record: Dict[str, Any]) -> Iterator[Tuple[Tuple[Any, ...], str, Any]]:
  """(path, kind, value) of every leaf outside the record's identity; path: the keys and list
  indices down to it (`path_text` writes it); kind: "value", "duration" (under a key naming a
  time) or "rate" (tok/s, load: also a timing, not a duration), e.g.
  (("outcomes", "ar", "0", 0, "values", 3), "value", 1.0)."""
  names = tuple(n for n in (record.get("name"), _args(record).get("record")) if n)

  def walk(obj, path: Tuple[Any, ...], kind: str):
    if isinstance(obj, dict):
      for key, value in obj.items():
        key = str(key)
        if key in NESTED_IDENTITY or _is_place_flag(key, value, path):
          continue
        inner = kind
        if kind == "value" and RATE_KEY.search(key):
          inner = "rate"
        elif kind == "value" and DURATION_KEY.search(key):
          inner = "duration"
        yield from walk(value, path + (key,), inner)
    elif isinstance(obj, list):
      for i, value in enumerate(obj):
        yield from walk(value, path + (i,), kind)
    elif not _is_name(obj, names):
      yield path, kind, obj

  top = {k: v for k, v in record.items() if k not in IDENTITY_KEYS}
  yield from walk(top, (), "value")


def _args(record: Dict[str, Any]) -> Dict[str, Any]:
  args = record.get("args")
  return args if isinstance(args, dict) else {}


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool:
  """Equal as measured values: booleans, strings, None and integers exactly (True is not 1);
  floats to a relative 1e-9 (JSON round trips); NaN equals NaN."""
  if not (_number(a) and _number(b)):
    return type(a) is type(b) and a == b
  if isinstance(a, int) and isinstance(b, int):
    return a == b
  if math.isnan(a) or math.isnan(b):
    return math.isnan(a) and math.isnan(b)
  return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def _device(record: Dict[str, Any]) -> Tuple[Any, ...]:
  hw = record.get("device") or record.get("hardware") or {}
  hw = hw if isinstance(hw, dict) else {"device": hw}
  return tuple(hw.get(k) for k in ("cpu", "backend", "device", "num_devices"))


def compare(old: Dict[str, Any], new: Dict[str, Any]) -> Comparison:
  """Every measured leaf of `old` against `new` (see the module docstring)."""
  a = {p: (t, v) for p, t, v in leaves(old)}
  b = {p: (t, v) for p, t, v in leaves(new)}
  measured, differ, ratios = 0, [], []
  for path in sorted(a.keys() & b.keys(), key=path_text):
    (kind, va), (_, vb) = a[path], b[path]
    if kind != "value":
      numbers = _number(va) and _number(vb)
      if kind == "duration" and numbers and va and math.isfinite(va) and math.isfinite(vb):
        ratios.append(vb / va)
      continue
    measured += 1
    if not _equal(va, vb):
      differ.append((path_text(path), va, vb))
  untimed = lambda d, keys: sorted(path_text(p) for p in keys if d[p][0] == "value")  # noqa: E731
  return Comparison(
    measured=measured,
    differ=differ,
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


# Run in the checkout (argv: -m MODULE or path FILE): prints the long options of the first parser
# the benchmark parses with (at import, or in its `parse_args()`), and stops it there, before it
# runs anything. Seen is no Exception, so that no `except Exception` of the benchmark takes it.
FLAGS_PROBE = """
import argparse, importlib, json, runpy, sys
class Seen(BaseException):
  pass
def grab(self, *args, **kwargs):
  print(json.dumps([s for a in self._actions for s in a.option_strings]))
  raise Seen
argparse.ArgumentParser.parse_known_args = grab
kind, target = sys.argv[1:3]
sys.argv = [target]
try:
  if kind == "-m":
    names = vars(importlib.import_module(target))
  else:
    names = runpy.run_path(target, run_name="rerun_flags")
  if callable(names.get("parse_args")):
    names["parse_args"]()
except Seen:
  pass
"""


def benchmark_flags(command: str, repo: str, timeout_s: float = 180) -> Optional[List[str]]:
  """The long flags (without '--') the benchmark of `command` (`python -m benchmarks.x`,
  `python benchmarks/x.py`) parses, learnt from its own argparse parser in `repo`
  (FLAGS_PROBE); None when it could not be asked (no such program, no argparse, an error)."""
  words = [x for w in shlex.split(command)[1:] if not w.startswith("--") for x in program_words(w)]
  if len(words) == 2 and words[0] == "-m":
    kind, target = "-m", words[1]
  elif len(words) == 1 and words[0].endswith(".py"):
    kind, target = "path", os.path.join(repo, words[0])
  else:
    return None
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
  try:
    out = subprocess.run(
      [sys.executable, "-c", FLAGS_PROBE, kind, target],
      cwd=repo,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout_s,
    ).stdout.strip()
    options = json.loads(out.splitlines()[-1]) if out else None
  except (OSError, subprocess.SubprocessError, ValueError):
    return None
  if not isinstance(options, list):
    return None
  return [o[2:] for o in options if isinstance(o, str) and o.startswith("--") and o != "--help"]


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
  """{name: the latest earlier record of its series that ran the same command (`command_key`)}:
  x_r3 reruns x when x_r2 ran with other flags."""
  by_series: Dict[str, List[Tuple[int, str]]] = {}
  for name in records:
    base, place = series(name)
    by_series.setdefault(base, []).append((place, name))
  out = {}
  for members in by_series.values():
    members.sort()
    for i, (_, name) in enumerate(members):
      key = command_key(_command(records[name]))
      for _, before in reversed(members[:i]):
        if command_key(_command(records[before])) == key:
          out[name] = before
          break
  return out


def _command(record: Dict[str, Any]) -> str:
  command = record.get("command")
  return command if isinstance(command, str) else ""


def record_path(arg: str) -> str:
  """A record's JSON: a name in benchmarks/results or a path ending in .json."""
  return arg if arg.endswith(".json") else os.path.join("benchmarks", "results", f"{arg}.json")


def _load(arg: str) -> Tuple[str, Dict[str, Any]]:
  path = record_path(arg)
  if not os.path.lexists(path):  # the restore advice only for a file git tracks
    tracked = git._git(os.getcwd(), "ls-files", "--error-unmatch", "--", path, check=False)
    if tracked.returncode == 0:
      raise ValueError(
        f"the record {path} is gone but git tracks it: restore it (git checkout -- {path})"
      )
    if arg.endswith(".json"):
      raise ValueError(f"no file {path}: give a record's name or the path of its JSON")
    raise ValueError(
      f"no record {arg!r} in benchmarks/results: give a name `ls benchmarks/results` lists"
    )
  return os.path.basename(path)[: -len(".json")], record.read_record(path)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("old", help="the earlier record: a name in benchmarks/results or a JSON path")
  ap.add_argument("new", help="the rerun")
  ap.add_argument("--show", type=int, default=10, help="how many differing values to list")
  args = ap.parse_args(argv)
  try:
    (old_name, old), (_, new) = _load(args.old), _load(args.new)
  except (OSError, ValueError, git.GitError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  result = compare(old, new)
  print(result.summary(f"`{old_name}`"))
  for path, a, b in result.differ[: args.show]:
    print(f"  {path}: {_short(a)} -> {_short(b)}")
  return 0 if result.identical else 1


if __name__ == "__main__":
  sys.exit(main())
