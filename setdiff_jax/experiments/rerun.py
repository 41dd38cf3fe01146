"""Regenerate a record: rerun its command at this checkout's commit, as a new record in its series.

    python -m setdiff_jax.experiments.rerun tuned_arithmetic_r3            # -> tuned_arithmetic_r4
    python -m setdiff_jax.experiments.rerun decode_weights_bf16_r6 --set tuned_dirs=/runs/arith
    python -m setdiff_jax.experiments.rerun official_speed_w4_r4 --dry_run # print the command

The record's command is run again from a clean worktree of HEAD (`git worktree add --detach`, so
the files that run are the commit the new record names, whatever else lies in this checkout),
with a fresh output folder under --scratch (never an older run's folder: a benchmark would reuse
its checkpoints), `--record=` the next free name of the series (`NAME_rN`), and each placeholder
the record holds for this machine's paths (`--tuned_dirs=TUNED_DIRS`, `--official_dir=...`)
given with `--set flag=value`. The new record is copied into this checkout's benchmarks/results
and compared value by value with the one it reruns (`reproduce`); then run `publish` and commit.
The checkout must be clean (records and their tables apart) and on main: the record would
otherwise name a commit that did not run. The worktree is removed at the end; the output folder
and the run's log (`--scratch`/NAME/log.txt) are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from setdiff_jax.experiments import git, record, reproduce

RESULTS_DIR = os.path.join("benchmarks", "results")
DOCS_DIR = os.path.join("docs", "results")
OUTPUT_FLAGS = frozenset({"out", "output", "output_dir"})
# Folders beside the checkout that the code reads by a relative path (`../shared/data`: the Story
# Cloze CSV's default, evaluation/infill.py): linked beside the worktree, so `tree/../shared` is
# the checkout's.
SIBLINGS = ("shared",)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(/\S*)?$")  # OUTPUT_DIR, DIR/agg, SFT0


class RerunError(record.RecordError):
  """A record that cannot be rerun as asked (a placeholder without --set, a dirty checkout, a
  name already taken)."""


def next_name(name: str, taken: Sequence[str]) -> str:
  """The first free name after `name` in its series: "x_r2" -> "x_r3" (or later if taken)."""
  base, place = reproduce.series(name)
  place += 1
  while f"{base}_r{place}" in taken:
    place += 1
  return f"{base}_r{place}"


def plan_command(
  command: str,
  new_name: str,
  output_dir: str,
  settings: Dict[str, str],
  unset: Sequence[str] = (),
) -> List[str]:
  """The argv that reruns `command` (a record's command line): `python` -> this interpreter,
  `python benchmarks/x.py` -> `-m benchmarks.x`, output flags -> under `output_dir` (a
  placeholder's sub path kept: `DIR/agg` -> `output_dir/agg`), `--record=new_name`, `settings`
  ({flag: value}) replacing or adding flags, `unset` flags left out (`report_only`: a record
  that re-reported older runs is rerun whole); a placeholder left without a value is refused."""
  words = shlex.split(command)
  if len(words) < 2 or os.path.basename(words[0]) not in ("python", "python3"):
    raise RerunError(f"the record's command {command!r} is not a python command: rerun it by hand")
  argv, seen, missing = [sys.executable], set(), []
  for w in words[1:]:
    if not w.startswith("--"):
      argv += reproduce.program_words(w)
      continue
    flag, eq, value = w[2:].partition("=")
    seen.add(flag)
    if flag in unset:
      continue
    if flag in settings:
      value = settings[flag]
    elif flag == "record":
      value = new_name
    elif flag in OUTPUT_FLAGS and eq:
      sub = value.split("/", 1)[1] if PLACEHOLDER.match(value) and "/" in value else ""
      value = os.path.join(output_dir, sub) if sub else output_dir
    elif eq and any(PLACEHOLDER.match(v) for v in value.split(",")):
      missing.append(f"--{flag}={value}")
    elif eq and value.startswith("/") and not all(os.path.exists(v) for v in value.split(",")):
      missing.append(f"--{flag}={value} (not on this machine)")
    argv.append(f"--{flag}={value}" if eq else w)
  argv += [f"--{flag}={value}" for flag, value in settings.items() if flag not in seen]
  if "record" not in seen:
    argv.append(f"--record={new_name}")
  if missing:
    flags = " ".join(f"--set {m.split('=', 1)[0][2:]}=PATH" for m in missing)
    raise RerunError(
      f"the record's command reads {', '.join(missing)}: where the machine that ran it kept "
      f"those files; give yours with {flags}"
    )
  return argv


def rerun(
  name: str,
  repo: str,
  settings: Optional[Dict[str, str]] = None,
  new_name: Optional[str] = None,
  scratch: Optional[str] = None,
  dry_run: bool = False,
  timeout_s: Optional[float] = None,
  unset: Sequence[str] = (),
) -> Optional[str]:
  """Runs the record `name` again (see the module docstring); returns the new record's name
  (None for a dry run). RerunError before anything runs when it cannot be done as asked."""
  results = os.path.join(repo, RESULTS_DIR)
  path = os.path.join(results, f"{name}.json")
  if not os.path.isfile(path):
    raise RerunError(f"no record {name!r} in {results}: give a name `ls {RESULTS_DIR}` lists")
  with open(path) as f:
    old = json.load(f)
  taken = [fn[: -len(".json")] for fn in os.listdir(results) if fn.endswith(".json")]
  new_name = new_name or next_name(name, taken)
  if new_name in taken:
    raise RerunError(f"a record named {new_name!r} exists: choose another with --as")
  if not record.NAME_RE.match(new_name):
    raise RerunError(f"record name {new_name!r}: use lowercase letters, digits, '_', '.', '-'")
  scratch = os.path.abspath(scratch or os.path.join(tempfile.gettempdir(), "setdiff_rerun"))
  work = os.path.join(scratch, new_name)
  out = os.path.join(work, "out")
  argv = plan_command(old.get("command") or "", new_name, out, settings or {}, unset)
  print("rerun: " + shlex.join(argv), flush=True)
  if dry_run:
    return None
  # The worktree runs HEAD: an uncommitted edit would not run. New records (and the tables
  # generated from them) may wait uncommitted: several reruns are committed together.
  commit = record.clean_commit(repo, exclude=(RESULTS_DIR, DOCS_DIR))
  if os.path.exists(work):
    raise RerunError(f"{work} exists (an earlier rerun's folder): remove it or pass --scratch")
  tree = os.path.join(work, "tree")
  os.makedirs(work)
  for sibling in SIBLINGS:
    beside = os.path.join(os.path.dirname(os.path.abspath(repo)), sibling)
    if os.path.isdir(beside):
      os.symlink(beside, os.path.join(work, sibling))
  git._git(repo, "worktree", "add", "--detach", tree, commit)
  try:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
    with open(os.path.join(work, "log.txt"), "w") as log:
      print(f"rerun: at {commit[:10]} in {tree}; log in {log.name}", flush=True)
      proc = subprocess.run(
        argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
      )
    made = os.path.join(tree, RESULTS_DIR, f"{new_name}.json")
    if proc.returncode != 0 or not os.path.isfile(made):
      raise RerunError(
        f"the rerun exited with status {proc.returncode} and wrote "
        f"{'its record' if os.path.isfile(made) else 'no record'}: see {log.name}"
      )
    for fn in os.listdir(os.path.dirname(made)):  # the record and the images it links
      if fn == f"{new_name}.json" or fn.startswith(f"{new_name}_") or fn == f"{new_name}.png":
        shutil.copy2(os.path.join(os.path.dirname(made), fn), os.path.join(results, fn))
  finally:
    git._git(repo, "worktree", "remove", "--force", tree, check=False)
  with open(os.path.join(results, f"{new_name}.json")) as f:
    new = json.load(f)
  same_command = reproduce.command_key(old.get("command")) == reproduce.command_key(
    new.get("command")
  )
  if same_command:
    print(f"{new_name}: {reproduce.compare(old, new).summary(f'`{name}`')}")
  else:
    print(f"{new_name}: another command than {name}'s (--set changed it): not compared")
  print(f"next: python -m setdiff_jax.experiments.publish, then commit {RESULTS_DIR} and docs")
  return new_name


def _settings(items: Sequence[str]) -> Dict[str, str]:
  out = {}
  for item in items:
    flag, eq, value = item.partition("=")
    if not eq or not flag:
      raise RerunError(f"--set {item!r}: write flag=value (e.g. --set tuned_dirs=/runs/arith)")
    out[flag.lstrip("-")] = value
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("name", help="the record to rerun (a name in benchmarks/results)")
  ap.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="FLAG=VALUE",
    help="a flag of the command to give (a placeholder's path) or change",
  )
  ap.add_argument(
    "--unset",
    action="append",
    default=[],
    metavar="FLAG",
    help="a flag of the command to leave out (e.g. report_only)",
  )
  ap.add_argument("--as", dest="new_name", help="the new record's name (default: the next _rN)")
  ap.add_argument("--scratch", help="where output folders go (default: $TMPDIR/setdiff_rerun)")
  ap.add_argument("--dry_run", action="store_true", help="print the command, run nothing")
  args = ap.parse_args(argv)
  # A `kill` (SIGTERM) unwinds like Ctrl-C: subprocess.run stops the benchmark, `finally` removes
  # the worktree (the default action would leave both behind).
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  try:
    repo = git.top_level(os.getcwd())
    unset = [f.lstrip("-") for f in args.unset]
    rerun(
      args.name, repo, _settings(args.set), args.new_name, args.scratch, args.dry_run, unset=unset
    )
  except (record.RecordError, git.GitError, OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("stopped: the rerun was interrupted; its worktree was removed", file=sys.stderr)
    return 130
  return 0


if __name__ == "__main__":
  sys.exit(main())
