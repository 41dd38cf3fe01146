"""Where a record comes from: the checkout whose code ran, its clean commit on main's history,
the code its numbers depend on (measured paths that name tracked files), and its command as
anyone can rerun it.

The checkout checked and stamped is the one whose code runs: the one holding the `__main__`
script (`python -m benchmarks.x` from its root, as the benchmarks run). A program that is no file
of a checkout (`python -c`, a notebook, the test runner) falls back to the one holding
`results_dir`, and there the imported setdiff_jax must be that checkout's own. `results_dir` must
lie in that checkout and hold nothing but record files, and only those files are left out of the
clean-tree check: no choice of folder hides an uncommitted edit, and no record names the commit
of another checkout than the one whose code ran.
"""

from __future__ import annotations

import os
import re
import sys
from typing import List, Optional, Sequence

from setdiff_jax.errors import SetdiffError
from setdiff_jax.experiments import git

MAIN_REF = "main"
# What a results folder may hold: records, their images, write_json's temporary files and the
# name a rerun under way claims (`rerun.CLAIM`).
_RECORD_FILE = re.compile(
  r"^[a-z0-9][a-z0-9_.-]*((\+[0-9]+)?\.(json|png|svg)(\.[0-9]+\.tmp)?|\.rerun)$"
)
# The package this module belongs to (setdiff_jax/), to tell which checkout's library runs.
_PACKAGE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RecordError(SetdiffError, ValueError):
  """A record that must not be written (dirty tree, commit off main, a name already taken)."""


def clean_commit(repo: str, main_ref: str = MAIN_REF, exclude: Sequence[str] = ()) -> str:
  """HEAD's full hash, if the tree is clean (outside `exclude`) and HEAD is on `main_ref`'s
  history; otherwise a RecordError naming what to do. `exclude`: paths below the root."""
  for p in exclude:  # '.' or '' would leave every file out of the check
    if os.path.normpath(p) in (".", "") or os.path.isabs(p) or p.startswith(".."):
      raise RecordError(
        f"clean check of {repo}: exclude {p!r} is not a path below the checkout's root: name "
        "the folders of records (benchmarks/results), never the whole checkout"
      )
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


def _repo_of(path: str) -> Optional[str]:
  """The real path of the repository holding `path` (or its nearest existing parent), None
  outside every repository."""
  while not os.path.isdir(path):
    path = os.path.dirname(path)
  try:
    return os.path.realpath(git.top_level(path))
  except git.GitError:
    return None


def _program_repo() -> Optional[str]:
  """The checkout holding the `__main__` script (`python -m benchmarks.x`, `python
  benchmarks/x.py`): the code that runs. None for a program without one (`python -c`, a
  notebook, a pytest-xdist worker) or outside every checkout or ignored by git (an installed
  tool, e.g. pytest): the current directory says nothing there (tests run from one checkout and
  record into temporary ones)."""
  script = getattr(sys.modules.get("__main__"), "__file__", None)
  if not (script and os.path.isfile(script)):
    return None
  script = os.path.realpath(script)
  top = _repo_of(os.path.dirname(script))
  if top and git._git(top, "check-ignore", "-q", script, check=False).returncode == 0:
    return None
  return top


def checkout(results_dir: str, repo: Optional[str]) -> str:
  """The checkout a record in `results_dir` is checked against and stamped with: `repo` when
  given, else the one whose code runs (`_program_repo`), else the one holding results_dir. A
  results_dir of another repository, or a setdiff_jax imported from another checkout than the
  one named, refuses: the record would name a commit that did not run."""
  checkout = os.path.realpath(git.top_level(repo)) if repo else _program_repo()
  held_by = _repo_of(results_dir)
  checkout = checkout or held_by
  if checkout is None:
    raise RecordError(
      f"the results folder {results_dir} is in no git checkout: records are written into the "
      "checkout whose code runs (its benchmarks/results), stamped with its commit"
    )
  if held_by != checkout:
    raise RecordError(
      f"the results folder {results_dir} is not in the checkout {checkout} whose code runs "
      f"({'in ' + held_by if held_by else 'in no checkout'}): a record is stamped with the "
      "commit of the code that ran, so write it into that checkout (its benchmarks/results), "
      "or run the benchmark from the checkout that holds the folder"
    )
  ours = os.path.join(checkout, "setdiff_jax")
  if os.path.isfile(os.path.join(ours, "__init__.py")) and os.path.realpath(ours) != _PACKAGE:
    raise RecordError(
      f"this run imports setdiff_jax from {_PACKAGE}, not from the checkout {checkout} whose "
      f"commit the record would name: run from {checkout}'s root (python -m benchmarks.NAME), "
      "so that its own library runs"
    )
  return checkout


def record_files(checkout: str, results_dir: str) -> List[str]:
  """The files in results_dir that the clean check leaves out, as pathspecs from the checkout's
  root: records, their images and temporary files (other records made since the last commit
  wait there to be committed together). A folder holding anything else (code, subfolders)
  refuses, as leaving it out would hide that too."""
  if not os.path.isdir(results_dir):
    return []
  entries = [e for e in sorted(os.listdir(results_dir)) if not e.startswith(".")]
  other = [e for e in entries if not _RECORD_FILE.match(e)]
  if other:
    shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
    raise RecordError(
      f"the results folder {results_dir} holds {shown}, which are no record files: give a "
      "folder of records only (benchmarks/results), as its records are left out of the "
      "clean-tree check and nothing else may be"
    )
  rel = os.path.relpath(os.path.realpath(results_dir), checkout)
  # a backslash makes a glob character of the folder's path literal in the pathspec
  rel = re.sub(r"([][*?\\])", r"\\\1", rel)
  return [os.path.normpath(os.path.join(rel, e)) for e in entries]


def _is_exclude(spec: str) -> bool:
  if spec.startswith((":!", ":^")):
    return True
  return spec.startswith(":(") and "exclude" in spec[2 : spec.find(")")].split(",")


def measured(name: str, measured_paths, checkout: str, commit: str) -> List[str]:
  """`measured_paths` as a list, after refusing what would leave the record current forever:
  none, a string (iterated by character) or a pathspec that matches no tracked file."""
  if isinstance(measured_paths, (str, bytes)):
    raise RecordError(
      f"record {name}: measured_paths is the string {measured_paths!r}, which would be read "
      f"one character at a time: give a list of git pathspecs ([{measured_paths!r}])"
    )
  paths = list(measured_paths or [])
  if not paths:
    raise RecordError(f"record {name}: give the measured paths (the code its numbers depend on)")
  bad = [p for p in paths if not isinstance(p, str) or not p.strip()]
  if bad:
    raise RecordError(
      f"record {name}: measured paths {bad!r} are not git pathspecs: give strings such as "
      "'setdiff_jax' or 'benchmarks/speed_accuracy.py'"
    )

  def matched(specs):
    return bool(git._git(checkout, "ls-files", "-z", "--", *specs).stdout)

  # The tree is clean, so the index is the commit: ls-files lists the commit's files.
  unmatched = [p for p in paths if not _is_exclude(p) and not matched([p])]
  if unmatched or not matched(paths):
    raise RecordError(
      f"record {name}: the measured paths {unmatched or paths} match no file tracked at commit "
      f"{commit[:10]} in {checkout}: fix the spelling (`git ls-files` lists the tracked "
      "files); a record whose paths name no file could never turn stale"
    )
  return paths
