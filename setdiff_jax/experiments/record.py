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
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from setdiff_jax.errors import SetdiffError
from setdiff_jax.experiments import git

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
MAIN_REF = "main"


class RecordError(SetdiffError, ValueError):
  """A record that must not be written (dirty tree, commit off main, a name already taken)."""


def clean_commit(repo: str, main_ref: str = MAIN_REF, exclude: Sequence[str] = ()) -> str:
  """HEAD's full hash, if the tree is clean (outside `exclude`) and HEAD is on `main_ref`'s
  history; otherwise a RecordError naming what to do."""
  changed = git.dirty(repo, exclude)
  if changed:
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    raise RecordError(
      f"the checkout {repo} has uncommitted changes ({shown}): commit them (on {main_ref}) "
      "before recording a result, so that the record's commit is what ran"
    )
  commit = git.head(repo)
  if git.resolve(repo, main_ref) is None:
    raise RecordError(
      f"the repository {repo} has no branch {main_ref!r} to check the commit against"
    )
  if not git.is_ancestor(repo, commit, main_ref):
    raise RecordError(
      f"commit {commit[:10]} is not on {main_ref}'s history: merge it into {main_ref} (or run "
      f"from a commit of {main_ref}) before recording, so that the record's commit stays reachable"
    )
  return commit


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


_FLAG_PATH = re.compile(r"(?<!\S)--([A-Za-z0-9_.]+)=(\S+)")


def public_command(command: str, repo: str) -> str:
  """`command` as anyone can rerun it: a flag's absolute path inside `repo` becomes relative to
  it, one outside it (this machine's scratch folders) the flag's name in capitals
  (`--output_dir=/tmp/x/y` -> `--output_dir=OUTPUT_DIR`); a comma list is rewritten item by item.
  A record never holds this machine's paths."""
  root = os.path.realpath(repo)

  def item(flag: str, value: str) -> str:
    if not value.startswith("/"):
      return value
    real = os.path.realpath(value)
    if os.path.commonpath([real, root]) == root:
      return os.path.relpath(real, root)
    return flag.upper().replace(".", "_")

  def rewrite(m: re.Match) -> str:
    flag, value = m.group(1), m.group(2)
    return f"--{flag}=" + ",".join(item(flag, v) for v in value.split(","))

  return _FLAG_PATH.sub(rewrite, command)


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
    the record stale once a later commit touches one). `device`: where it ran (default: jax's
    devices and the CPU, `evaluation.results.hardware`). `repo`: the checkout (default: the one
    holding `results_dir`); `results_dir` itself is left out of the clean-tree check."""
    if not NAME_RE.match(name or ""):
      raise RecordError(
        f"record name {name!r}: use lowercase letters, digits, '_', '.', '-' (e.g. chain_lr_grid)"
      )
    if not measured_paths:
      raise RecordError(f"record {name}: give the measured paths (the code its numbers depend on)")
    results_dir = os.path.abspath(results_dir)
    repo = git.top_level(repo or (results_dir if os.path.isdir(results_dir) else os.getcwd()))
    inside = os.path.relpath(results_dir, repo)
    commit = clean_commit(repo, main_ref, exclude=() if inside.startswith("..") else (inside,))
    path = os.path.join(results_dir, f"{name}.json")
    config = json.loads(json.dumps(config, default=_jsonable))
    if os.path.exists(path):
      if not resume:
        raise RecordError(
          f"a record named {name!r} exists ({path}): choose another name, or pass resume=True "
          "(--resume) to continue it"
        )
      with open(path) as f:
        data = json.load(f)
      if data.get("commit") != commit:
        raise RecordError(
          f"record {name!r} was made at commit {str(data.get('commit'))[:10]}, this checkout is "
          f"at {commit[:10]}: a record holds one commit; start a new name"
        )
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
      "command": public_command(command, repo),
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
    write_json(self.path, self.data)


def _target(name, results_dir, resume, repo, main_ref) -> Tuple[str, str]:
  """(the record's path, the clean commit on main it is stamped with), after every refusal:
  a bad name, a dirty tree or a commit off main's history, an existing record unless `resume`
  and made at this commit."""
  if not NAME_RE.match(name or ""):
    raise RecordError(
      f"record name {name!r}: use lowercase letters, digits, '_', '.', '-' (e.g. chain_lr_grid)"
    )
  results_dir = os.path.abspath(results_dir)
  os.makedirs(results_dir, exist_ok=True)
  repo = git.top_level(repo or results_dir)
  inside = os.path.relpath(results_dir, repo)
  commit = clean_commit(repo, main_ref, exclude=() if inside.startswith("..") else (inside,))
  path = os.path.join(results_dir, f"{name}.json")
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    if not resume:
      raise RecordError(
        f"a record named {name!r} exists ({path}): choose another name (--record=NEW), or "
        "pass --record_resume to replace it with a re-report of the same commit"
      )
    if old.get("commit") != commit:
      raise RecordError(
        f"record {name!r} was made at commit {str(old.get('commit'))[:10]}, this checkout is at "
        f"{commit[:10]}: a record holds one commit; start a new name"
      )
  return path, commit


def check_publishable(
  name: str,
  results_dir: str,
  resume: bool = False,
  repo: Optional[str] = None,
  main_ref: str = MAIN_REF,
) -> None:
  """Raises the RecordError `publish_report` would raise for `name`, before a benchmark spends
  its run: a record it could not write at the end is refused at the start."""
  _target(name, results_dir, resume, repo, main_ref)


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
  name the markdown links: its path}) are copied beside it as `<name>.png` (`<name>_<k>.png`)
  and relinked. Refuses what `RunRecord.create` refuses; `resume=True` replaces a record of the
  same name made at the same commit (a re-report). Returns the record's path.
  `python -m setdiff_jax.experiments.publish` then regenerates docs/results."""
  if not report.get("markdown"):
    raise RecordError(f"record {name}: the report has no 'markdown' (its rendered tables)")
  path, commit = _target(name, results_dir, resume, repo, main_ref)
  results_dir = os.path.dirname(path)
  data = dict(report)
  markdown = data["markdown"]
  if isinstance(data.get("command"), str):  # as its tables quote it, too
    public = public_command(data["command"], git.top_level(repo or results_dir))
    markdown = markdown.replace(data["command"], public)
    data["command"] = public
  for k, (link, src) in enumerate(sorted((images or {}).items())):
    if not os.path.isfile(src):
      continue
    dest = f"{name}.png" if k == 0 else f"{name}_{k}.png"
    with open(src, "rb") as fin, open(os.path.join(results_dir, dest), "wb") as fout:
      fout.write(fin.read())
    markdown = markdown.replace(f"]({link})", f"]({dest})")
  data.update(
    name=name,
    commit=commit,
    markdown=markdown,
    measured_paths=list(measured_paths),
    date=data.get("date") or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
  )
  write_json(path, data, compact)
  return path
