"""A run record: one named JSON file per experiment, written only from a clean checkout whose
commit is on main's history, never over another record.

    rec = RunRecord.create(name="chain_lr_grid", results_dir="benchmarks/results",
                           command=" ".join(sys.argv), config={...}, seeds=[0, 1, 2],
                           measured_paths=["setdiff_jax", "benchmarks/speed_accuracy.py"])
    rec.add_outcomes("setdlm4 W=4 off", seed=0, problems=ids, values=correct, seconds=secs)
    rec.save()

The file holds the commit, command, config, seeds, device, start date, the measured paths (for
the staleness check of `publish`) and every (arm, seed, problem) outcome with its timing, so an
interval or a new table can be computed again from the file alone. A second run under the same
name refuses unless `resume=True`, and a resume refuses a different commit or config.

Every write seals the record: its 'seal' is the sha256 of its canonical JSON, `provenance` and
notes apart (`seal_of`), and `publish` refuses a record whose data or tables were changed after
(`check_seal`): a table cannot drift from the outcomes it was rendered from.

Which checkout and commit a record names, and which of its paths it measured, is
`provenance`'s.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from setdiff_jax.experiments import provenance
from setdiff_jax.experiments.provenance import MAIN_REF, RecordError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# The images publish relinks in docs/results. A record's first image is `<name>.png`, the k-th
# extra one `<name>+<k>.png`: '+' is in no record name, so no two records' files can collide.
IMAGE_EXTS = (".png", ".svg")


def _jsonable(x):
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_json(path: str, obj, compact: bool = False) -> None:
  """Writes json atomically (a killed run leaves the previous file, never half of one); the
  temporary name is per process, as parallel runs may share a folder. `compact`: no
  indentation (records with per-problem lists)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    layout = {"separators": (",", ":")} if compact else {"indent": 1}
    json.dump(obj, f, default=_jsonable, **layout)
    f.write("\n")
  os.replace(tmp, path)


# Left out of a record's seal: the seal itself and what people add by hand once a benchmark wrote
# the record (its `provenance`: why a kept record stays; notes: `why_kept`, `*_note`), as the
# history of benchmarks/results shows. Its data, tables, commit, command and dates are sealed.
UNSEALED = frozenset({"seal", "provenance", "why_kept"})
SEAL_PREFIX = "sha256:"


def seal_of(data: Dict[str, Any], name: str) -> str:
  """'sha256:<hex>' of the canonical JSON (sorted keys, no spaces, UTF-8) of record `data`
  without its UNSEALED fields; `name` (the file's) stands in for a missing 'name' field, so a
  record copied under another file name no longer matches its seal."""
  part = {k: v for k, v in data.items() if k not in UNSEALED and not k.endswith("_note")}
  part.setdefault("name", name)
  text = json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
  return SEAL_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def sealed(data: Dict[str, Any], name: str) -> Dict[str, Any]:
  """`data` as JSON reads it back (numpy values, tuples made plain), its seal first: what a
  benchmark writes, so that `check_seal` recomputes the same digest from the file."""
  plain = json.loads(json.dumps(data, default=_jsonable))
  plain.pop("seal", None)
  return {"seal": seal_of(plain, name), **plain}


def check_seal(path: str, data: Dict[str, Any]) -> None:
  """Refuses (one RecordError naming the file and the fix) the record `data` read from `path`
  whose 'name' is not its file's, that has no seal, or whose data or tables changed since its
  benchmark wrote it (only the UNSEALED fields may be edited by hand)."""
  name = os.path.basename(path)[: -len(".json")]
  fix = f"restore it (git checkout -- {path}) or rerun its benchmark, which writes and seals it"
  if data.get("name") is not None and data.get("name") != name:
    raise RecordError(
      f"the record {path} names itself {data.get('name')!r}: a record's name is its file's; "
      f"rename the file back, or {fix}"
    )
  if not data.get("seal"):
    raise RecordError(f"the record {path} has no seal, so no benchmark wrote it as it is: {fix}")
  if data["seal"] != seal_of(data, name):
    raise RecordError(
      f"the record {path} changed since its benchmark wrote it (its seal does not match its "
      f"data and tables; only its provenance and notes may be edited by hand): {fix}"
    )


def owns(name: str, filename: str) -> bool:
  """Whether `filename` (in a results folder) is one of record `name`'s files: `<name>.json`,
  its first image `<name>.png` / `.svg` and its k-th extra one `<name>+<k>.png` / `.svg`."""
  if filename in [f"{name}.json"] + [f"{name}{ext}" for ext in IMAGE_EXTS]:
    return True
  extra = re.fullmatch(re.escape(name) + r"\+[0-9]+(\.[a-z]+)", filename)
  return bool(extra) and extra.group(1) in IMAGE_EXTS


def _image_name(name: str, k: int, src: str) -> str:
  ext = os.path.splitext(src)[1].lower()
  if ext not in IMAGE_EXTS:
    raise RecordError(
      f"record {name}: the image {src} is not a {' or '.join(IMAGE_EXTS)} file, the kinds "
      "docs/results shows: save the plot as one (e.g. plt.savefig('plot.png'))"
    )
  return f"{name}{ext}" if k == 0 else f"{name}+{k}{ext}"


# The fields every tool reads, and what they must hold (a record of another shape is refused
# by name rather than half-read).
FIELD_TYPES = {
  "command": str,
  "commit": str,
  "date": str,
  "markdown": str,
  "args": dict,
  "device": dict,
  "hardware": dict,
  "provenance": dict,
  "measured_paths": list,
}


def read_record(path: str) -> Dict[str, Any]:
  """The record (a JSON object) at `path`, or one RecordError naming the file and the fix (not
  UTF-8 JSON, not an object, a field of the wrong type)."""
  fix = f"restore it (git checkout -- {path}) or remove it, then run again"
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise RecordError(f"the record {path} cannot be read ({e}): {fix}") from e
  if not isinstance(data, dict):
    raise RecordError(
      f"the record {path} holds a JSON {type(data).__name__}, not a record (an object): {fix}"
    )
  for field, kind in FIELD_TYPES.items():
    value = data.get(field)
    if value is not None and not isinstance(value, kind):
      raise RecordError(
        f"the record {path}: field {field!r} is a {type(value).__name__}, not a "
        f"{kind.__name__}: {fix}"
      )
  return data


class RunRecord:
  """One experiment's record (`data` is the JSON object); build it with `create`."""

  def __init__(self, path: str, data: Dict[str, Any]):
    self.path, self.data = path, data

  @classmethod
  def create(
    cls,
    name: str,
    results_dir: str,
    command: str,
    config: Dict[str, Any],
    seeds: Sequence[int],
    measured_paths: Sequence[str],
    device: Optional[Dict[str, Any]] = None,
    resume: bool = False,
    repo: Optional[str] = None,
    main_ref: str = MAIN_REF,
  ) -> "RunRecord":
    """Checks the checkout and the name, then returns the record (loaded when resuming).

    `measured_paths`: git pathspecs of the code the numbers depend on (the publish step marks
    the record stale once a later commit touches one; each must match a tracked file).
    `device`: where it ran (default: jax's devices and the CPU, `evaluation.results.hardware`).
    `repo`: the checkout (default: the one whose code runs, see the module docstring)."""
    path, commit, repo = _target(name, results_dir, resume, repo, main_ref, measured_paths)
    config = json.loads(json.dumps(config, default=_jsonable))
    if os.path.exists(path):  # resuming (`_target` refuses otherwise), at the same commit
      data = read_record(path)
      if data.get("config") != config:
        raise RecordError(
          f"record {name!r} was made with another config: start a new name to change settings"
        )
      return cls(path, data)
    if device is None:
      from setdiff_jax.evaluation.results import hardware  # jax only when a device is needed

      device = hardware()
    data = {
      "name": name,
      "commit": commit,
      "command": provenance.public_command(command, repo),
      "config": config,
      "seeds": [int(s) for s in seeds],
      "measured_paths": list(measured_paths),
      "device": device,
      "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
      "outcomes": [],
      "timings": {},
      "markdown": None,
    }
    rec = cls(path, data)
    rec.save()  # the name is taken from here on
    return rec

  def add_outcomes(
    self,
    arm: str,
    seed: int,
    problems: Sequence[Any],
    values: Sequence[float],
    seconds: Optional[Sequence[float]] = None,
  ) -> None:
    """One arm's per-problem outcomes (e.g. 1.0 correct / 0.0 wrong) for one seed, with each
    problem's decoding seconds when measured. An (arm, seed) already present refuses."""
    if self.has(arm, seed):
      raise RecordError(f"record {self.data['name']}: {arm!r} seed {seed} is already recorded")
    if len(problems) != len(values) or (seconds is not None and len(seconds) != len(values)):
      raise RecordError(
        f"record {self.data['name']}: {arm!r} seed {seed}: problems, values and seconds "
        "must have one entry per problem"
      )
    _unique_problems(self.data["name"], arm, seed, problems)
    self.data["outcomes"].append(
      {
        "arm": arm,
        "seed": int(seed),
        "problems": list(problems),
        "values": [float(v) for v in values],
        "seconds": None if seconds is None else [float(s) for s in seconds],
      }
    )

  def has(self, arm: str, seed: int) -> bool:
    return any(o["arm"] == arm and o["seed"] == int(seed) for o in self.data["outcomes"])

  def arms(self) -> List[str]:
    return list(dict.fromkeys(o["arm"] for o in self.data["outcomes"]))

  def matrix(self, arm: str, key: str = "values") -> np.ndarray:
    """[seeds, problems] of `arm` (seeds in the record's order, problems in the first seed's
    order; every seed must hold the same problems: the paired bootstrap relies on it)."""
    rows = {o["seed"]: o for o in self.data["outcomes"] if o["arm"] == arm}
    missing = [s for s in self.data["seeds"] if s not in rows]
    if missing:
      raise RecordError(f"record {self.data['name']}: {arm!r} has no outcomes for seeds {missing}")
    first = rows[self.data["seeds"][0]]["problems"]
    out = []
    for s in self.data["seeds"]:
      o = rows[s]
      _unique_problems(self.data["name"], arm, s, o["problems"])  # a file written before the check
      if sorted(map(str, o["problems"])) != sorted(map(str, first)):
        raise RecordError(f"record {self.data['name']}: {arm!r} seed {s} holds other problems")
      by = dict(zip(map(str, o["problems"]), o[key]))
      out.append([by[str(p)] for p in first])
    return np.asarray(out, float)

  def set_timing(self, key: str, seconds: float) -> None:
    self.data["timings"][key] = float(seconds)

  def set_markdown(self, text: str) -> None:
    """The record's tables, rendered from its own data (docs/results shows them)."""
    self.data["markdown"] = text

  def save(self) -> None:
    write_json(self.path, sealed(self.data, self.data["name"]))


def _unique_problems(name: str, arm: str, seed: int, problems: Sequence[Any]) -> None:
  """Refuses repeated problem ids: `matrix` aligns seeds by id, where a repeat would keep one
  value of the two. Ids are compared as str(), as the alignment does (1 and "1" are one id)."""
  repeats = [p for p, n in Counter(map(str, problems)).items() if n > 1]
  if repeats:
    raise RecordError(
      f"record {name}: {arm!r} seed {seed}: the problem ids {repeats[:5]} occur more than once "
      "(ids are compared as text, so 1 and '1' are one id): give each problem once, under an "
      "id of its own"
    )


def _target(name, results_dir, resume, repo, main_ref, measured_paths=None) -> Tuple[str, str, str]:
  """(the record's path, the clean commit on main it is stamped with, the checkout), after every
  refusal: a bad name, a results folder outside the checkout whose code runs or holding other
  files than records, a dirty tree or a commit off main's history, measured paths that match no
  file (when given), an existing record unless `resume` and made at this commit."""
  if not NAME_RE.match(name or ""):
    raise RecordError(
      f"record name {name!r}: use lowercase letters, digits, '_', '.', '-' (e.g. chain_lr_grid)"
    )
  results_dir = os.path.abspath(results_dir)
  checkout = provenance.checkout(results_dir, repo)
  commit = provenance.clean_commit(
    checkout, main_ref, exclude=provenance.record_files(checkout, results_dir)
  )
  if measured_paths is not None:
    provenance.measured(name, measured_paths, checkout, commit)
  path = os.path.join(results_dir, f"{name}.json")
  if os.path.exists(path):
    if not resume:
      raise RecordError(
        f"a record named {name!r} exists ({path}): choose another name (--record=NEW), or "
        "pass --record_resume (resume=True) to continue or re-report it at the same commit"
      )
    old = read_record(path)
    if old.get("commit") != commit:
      raise RecordError(
        f"record {name!r} was made at commit {str(old.get('commit'))[:10]}, this checkout is at "
        f"{commit[:10]}: a record holds one commit; start a new name"
      )
  return path, commit, checkout


def check_publishable(
  name: str,
  results_dir: str,
  resume: bool = False,
  repo: Optional[str] = None,
  main_ref: str = MAIN_REF,
  measured_paths: Optional[Sequence[str]] = None,
) -> None:
  """Raises the RecordError `publish_report` would raise for `name` (and for `measured_paths`,
  when given), before a benchmark spends its run: a record it could not write at the end is
  refused at the start."""
  _target(name, results_dir, resume, repo, main_ref, measured_paths)


def publish_report(
  report: Dict[str, Any],
  name: str,
  results_dir: str,
  measured_paths: Sequence[str],
  images: Optional[Dict[str, str]] = None,
  resume: bool = False,
  repo: Optional[str] = None,
  main_ref: str = MAIN_REF,
  compact: bool = False,
) -> str:
  """The one publish step of a benchmark: writes `report` (its JSON object, holding the
  'markdown' its tables were rendered into) as the record `<results_dir>/<name>.json`, stamped
  with the clean commit on main's history, the date and the measured paths; `images` ({the file
  name the markdown links: its path}, .png or .svg; missing files are skipped) are copied beside
  it as `<name>.png` and `<name>+<k>.png` (their own extension kept) and relinked. Refuses what
  `RunRecord.create` refuses; `resume=True` replaces a record of the same name made at the
  same commit (a re-report). Returns the record's path.
  `python -m setdiff_jax.experiments.publish` then regenerates docs/results."""
  if not report.get("markdown"):
    raise RecordError(f"record {name}: the report has no 'markdown' (its rendered tables)")
  path, commit, checkout = _target(name, results_dir, resume, repo, main_ref, measured_paths)
  results_dir = os.path.dirname(path)
  data = dict(report)
  markdown = data["markdown"]
  if isinstance(data.get("command"), str):  # as its tables quote it, too
    public = provenance.public_command(data["command"], checkout)
    markdown = markdown.replace(data["command"], public)
    data["command"] = public
  present = [(link, src) for link, src in sorted((images or {}).items()) if os.path.isfile(src)]
  copies = [(link, src, _image_name(name, k, src)) for k, (link, src) in enumerate(present)]
  os.makedirs(results_dir, exist_ok=True)
  for link, src, dest in copies:  # every name is this record's own (see `owns`)
    tmp = os.path.join(results_dir, f"{dest}.{os.getpid()}.tmp")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
      fout.write(fin.read())
    os.replace(tmp, os.path.join(results_dir, dest))
    markdown = markdown.replace(f"]({link})", f"]({dest})")
  data.update(
    name=name,
    commit=commit,
    markdown=markdown,
    measured_paths=list(measured_paths),
    date=data.get("date") or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
  )
  write_json(path, sealed(data, name), compact)
  return path
