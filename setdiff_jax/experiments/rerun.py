"""Regenerate a record: rerun its command at this checkout's commit, as a new record in its series.

    python -m setdiff_jax.experiments.rerun tuned_arithmetic_r3            # -> tuned_arithmetic_r4
    python -m setdiff_jax.experiments.rerun decode_weights_bf16_r6 --set tuned_dirs=/runs/arith
    python -m setdiff_jax.experiments.rerun official_speed_w4_r4 --dry_run # print the command

The record's command is run again from a clean worktree of HEAD (`git worktree add --detach`, so
the files that run are the commit the new record names, whatever else lies in this checkout),
with a fresh output folder under --scratch (never an older run's folder: a benchmark would reuse
its checkpoints), `--record=` the next free name of the series (`NAME_rN`), and each path the
record holds that this machine lacks given with `--set flag=PATH`:
- a placeholder, as `provenance.public_command` writes one: the flag's name in capitals
  (`--tuned_dirs=TUNED_DIRS`, `--official_dir=OFFICIAL_DIR`), or any capitals for a flag named as
  a path (`--sft_workdirs=SFT0,SFT1`: older records); `--dtype=BF16` is a value, not a path;
- an absolute path that does not exist here;
- a relative path (one inside the checkout that ran it) that git does not track at HEAD, so the
  worktree lacks it: one this checkout holds (git-ignored data: `runs/data.txt`), or one inside a
  folder this checkout holds.
A command without an output flag (--out, --output, --output_dir) is refused until one is given
(`--set output_dir=DIR`): the benchmark's default folder is an older run's, or inside the
worktree. `--set` replaces a flag's value or adds the flag, which must be the command's or one its
benchmark parses (asked of its parser before anything runs, `reproduce.benchmark_flags`); a switch
(`--report_only`) is left out with `--unset`, which must name a flag of the command. The rerun names and places its record
itself: `record` and `results_dir` are not --set or --unset (`--as NEW` names it), and a
`--results_dir` of the command is left out.

The new name is claimed in benchmarks/results (`NAME_rN.rerun`, removed at the end) so that two
reruns at once take two names, and no record is ever copied over another. The record the run
writes is kept in --scratch/NAME_rN/record, copied into this checkout's benchmarks/results when
the run succeeded and compared value by value with the one it reruns (`reproduce`); then run
`publish` and commit. The checkout must be clean (records and their tables apart) and on main:
the record would otherwise name a commit that did not run. The worktree is removed at the end;
the output folder and the run's log (--scratch/NAME_rN/log.txt, whose last line a failed run's
error quotes) are kept.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from setdiff_jax.experiments import git, provenance, record, reproduce

RESULTS_DIR = os.path.join("benchmarks", "results")
DOCS_DIR = os.path.join("docs", "results")
OUTPUT_FLAGS = frozenset({"out", "output", "output_dir"})
# Flags the rerun sets itself: the record's name (--as) and where it is written (the worktree's
# RESULTS_DIR, where the rerun takes it from).
OWN_FLAGS = ("record", "results_dir")
# Folders beside the checkout that the code reads by a relative path (`../shared/data`: the Story
# Cloze CSV's default, evaluation/infill.py): linked beside the worktree, so `tree/../shared` is
# the checkout's.
SIBLINGS = ("shared",)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(/\S*)?$")  # an output flag's: OUTPUT_DIR, DIR/agg, OUT
CAPITALS = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Flags named as paths, whose capitals are placeholders even when they are not the flag's name
# (records written before `public_command`: --sft_workdirs=SFT0,SFT1, --results_dir=RESULTS).
PATH_FLAG = re.compile(r"(dir|dirs|path|paths|file|files|python)$")
SWITCH_OFF = frozenset({"", "false", "0", "no", "off", "none"})
CLAIM = ".rerun"  # benchmarks/results/NAME_rN.rerun: a rerun under way writes NAME_rN


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


def is_placeholder(flag: str, item: str) -> bool:
  """Whether `item` (one of a flag's comma-separated values) stands for a path of the machine
  that ran the record: the flag's name in capitals, as `provenance.public_command` writes it
  (`--tuned_dirs=TUNED_DIRS`), or capitals for a flag named as a path (`--sft_workdirs=SFT0`);
  a sub path is kept (`DIR/agg`)."""
  head = item.split("/", 1)[0]
  return head == flag.upper().replace(".", "_") or bool(
    CAPITALS.match(head) and PATH_FLAG.search(flag)
  )


def _untracked(repo: str, item: str) -> bool:
  """Whether `item` is a relative path under `repo` that HEAD's worktree lacks: git does not
  track it at HEAD, and this checkout holds it (git-ignored data) or the folder it starts in."""
  path = os.path.normpath(item)
  if not item or os.path.isabs(item) or path == "." or path.startswith(".."):
    return False
  top = path.split(os.sep, 1)[0]
  here = os.path.exists(os.path.join(repo, path))
  if not (here or (os.sep in path and os.path.isdir(os.path.join(repo, top)))):
    return False  # not a path of the checkout (`threshold:off/0.9` is a value)
  return git._git(repo, "cat-file", "-e", f"HEAD:{path}", check=False).returncode != 0


def _unavailable(flag: str, value: str, repo: Optional[str]) -> List[str]:
  """`--flag=value` with why, if it names a path this rerun cannot read (see the module
  docstring); [] otherwise."""
  items = value.split(",")
  if any(is_placeholder(flag, v) for v in items):
    return [f"--{flag}={value}"]
  if any(v.startswith("/") and not os.path.exists(v) for v in items):
    return [f"--{flag}={value} (not on this machine)"]
  if repo and any(_untracked(repo, v) for v in items):
    return [f"--{flag}={value} (not tracked by git: the worktree lacks it)"]
  return []


def _check_set_flags(command: str, settings: Dict[str, str], repo: str) -> None:
  """Refuses, before anything runs, a --set of a flag that neither the record's command nor its
  benchmark has (a misspelt flag would fail the run after its worktree was made)."""
  given = {w[2:].partition("=")[0] for w in shlex.split(command) if w.startswith("--")}
  new = [flag for flag in settings if flag not in given]
  known = reproduce.benchmark_flags(command, repo) if new else None
  unknown = [flag for flag in new if known is not None and flag not in known]
  if unknown:
    flag = unknown[0]
    close = difflib.get_close_matches(flag, known, 1)
    hint = f" (did you mean --{close[0]}?)" if close else ""
    raise RerunError(
      f"--set {flag}={settings[flag]}: neither the record's command nor its benchmark has "
      f"--{flag}{hint}; check the spelling (its flags: {', '.join('--' + f for f in known)})"
    )


def _check_changes(
  flags: Sequence[str], bare: Sequence[str], settings: Dict[str, str], unset: Sequence[str]
) -> None:
  """Refuses a --set / --unset that would be dropped or would lose the record: `flags` are the
  command's, `bare` those written without a value (switches)."""
  for flag in OWN_FLAGS:
    if flag in settings or flag in unset:
      how = f"--set {flag}={settings[flag]}" if flag in settings else f"--unset {flag}"
      raise RerunError(
        f"{how}: the rerun names its record and takes it from the worktree's {RESULTS_DIR} "
        "itself; give the name with --as NEW"
      )
  for flag in unset:
    if flag in settings:
      raise RerunError(f"--set {flag} and --unset {flag}: give one of them")
    if flag not in flags:
      have = ", ".join(f"--{f}" for f in dict.fromkeys(flags)) or "none"
      raise RerunError(
        f"--unset {flag}: the record's command has no --{flag} (its flags: {have}); "
        "check the spelling"
      )
  for flag, value in settings.items():
    if flag in bare and value.strip().lower() in SWITCH_OFF:
      raise RerunError(
        f"--set {flag}={value}: --{flag} is a switch in the record's command (given without a "
        f"value): leave it out with --unset {flag}"
      )


def plan_command(
  command: str,
  new_name: str,
  output_dir: str,
  settings: Dict[str, str],
  unset: Sequence[str] = (),
  repo: Optional[str] = None,
) -> List[str]:
  """The argv that reruns `command` (a record's command line): `python` -> this interpreter,
  `python benchmarks/x.py` -> `-m benchmarks.x`, output flags -> under `output_dir` (a
  placeholder's sub path kept: `DIR/agg` -> `output_dir/agg`), `--record=new_name`, no
  `--results_dir`, `settings` ({flag: value}) replacing or adding flags (`--flag=value`, a switch
  too), `unset` flags left out (`report_only`: a record that re-reported older runs is rerun
  whole). Refused: a path the rerun cannot read (placeholders; with `repo`, also relative paths
  git does not track), no output flag, and the --set / --unset that `_check_changes` refuses."""
  words = shlex.split(command)
  if len(words) < 2 or os.path.basename(words[0]) not in ("python", "python3"):
    raise RerunError(f"the record's command {command!r} is not a python command: rerun it by hand")
  parsed = [w[2:].partition("=") for w in words[1:] if w.startswith("--")]
  flags = [flag for flag, _, _ in parsed]
  _check_changes(flags, [flag for flag, eq, _ in parsed if not eq], settings, unset)
  argv, missing, has_output = [sys.executable], [], False
  for w in words[1:]:
    if not w.startswith("--"):
      argv += reproduce.program_words(w)
      continue
    flag, eq, value = w[2:].partition("=")
    if flag in unset or flag == "results_dir":
      continue
    if flag in settings:
      eq, value = "=", settings[flag]
    elif flag == "record":
      value = new_name
    elif flag in OUTPUT_FLAGS and eq:
      sub = value.split("/", 1)[1] if PLACEHOLDER.match(value) and "/" in value else ""
      value = os.path.join(output_dir, sub) if sub else output_dir
      has_output = True
    elif eq:
      missing += _unavailable(flag, value, repo)
    argv.append(f"--{flag}={value}" if eq else w)
  argv += [f"--{flag}={value}" for flag, value in settings.items() if flag not in flags]
  has_output = has_output or any(flag in OUTPUT_FLAGS for flag in settings)
  if "record" not in flags:
    argv.append(f"--record={new_name}")
  if missing:
    asks = dict.fromkeys(f"--set {m.split('=', 1)[0][2:]}=PATH" for m in missing)
    raise RerunError(
      f"the record's command reads {', '.join(missing)}: where the machine that ran it kept "
      f"those files; give yours with {' '.join(asks)}"
    )
  if not has_output:
    raise RerunError(
      "the record's command gives no output folder (--out, --output or --output_dir): the "
      "benchmark would write into its default one (an older run's, or one in the worktree, "
      f"removed at the end); give a fresh one with --set output_dir={output_dir} (or the "
      "benchmark's own output flag)"
    )
  return argv


def _load(name: str, results: str) -> Tuple[Dict, List[str]]:
  """(the record `name`, the names taken in `results`: records and claims)."""
  if not record.NAME_RE.match(name or ""):
    raise RerunError(f"record name {name!r}: give a name `ls {RESULTS_DIR}` lists (not a path)")
  path = os.path.join(results, f"{name}.json")
  if not os.path.isfile(path):
    raise RerunError(f"no record {name!r} in {results}: give a name `ls {RESULTS_DIR}` lists")
  old = record.read_record(path)
  taken = [os.path.splitext(fn)[0] for fn in os.listdir(results) if fn.endswith((".json", CLAIM))]
  return old, taken


def _refuse_taken(results: str, new_name: str) -> None:
  """The RerunError for a name taken by a record, or claimed by a rerun under way."""
  claim = os.path.join(results, new_name + CLAIM)
  if os.path.exists(os.path.join(results, f"{new_name}.json")) or not os.path.exists(claim):
    raise RerunError(f"a record named {new_name!r} exists: choose another name with --as")
  raise RerunError(
    f"a rerun under way makes {new_name!r} ({claim}; remove that file if none runs): choose "
    "another name with --as"
  )


def _claim(results: str, new_name: str, note: str) -> str:
  """Creates `results/new_name.rerun` (FileExistsError if another rerun holds it, or if the
  record exists), so that no other rerun takes the name; returns its path."""
  path = os.path.join(results, new_name + CLAIM)
  with open(path, "x") as f:
    f.write(note)
  if os.path.exists(os.path.join(results, f"{new_name}.json")):
    os.remove(path)
    raise FileExistsError(path)
  return path


def _keep_record(tree: str, before: Sequence[str], new_name: str, dest: str) -> List[str]:
  """Copies the files the run added to the worktree's RESULTS_DIR for `new_name` (its record and
  the images it links) into `dest`, before the worktree goes; returns their names."""
  made = os.path.join(tree, RESULTS_DIR)
  listed = sorted(os.listdir(made)) if os.path.isdir(made) else []
  names = [fn for fn in listed if fn not in before and record.owns(new_name, fn)]
  if names:
    os.makedirs(dest, exist_ok=True)
  for fn in names:
    shutil.copy2(os.path.join(made, fn), os.path.join(dest, fn))
  return names


def _run(argv: List[str], repo: str, commit: str, work: str, new_name: str, timeout_s) -> List[str]:
  """Runs `argv` in a worktree of `commit` under `work` (removed at the end), keeping the record
  it writes in `work`/record; returns the kept files' names. RerunError if the run failed."""
  if os.path.exists(work):
    raise RerunError(f"{work} exists (an earlier rerun's folder): remove it or pass --scratch")
  tree, kept = os.path.join(work, "tree"), os.path.join(work, "record")
  os.makedirs(work)
  for sibling in SIBLINGS:
    beside = os.path.join(os.path.dirname(os.path.abspath(repo)), sibling)
    if os.path.isdir(beside):
      os.symlink(beside, os.path.join(work, sibling))
  git._git(repo, "worktree", "add", "--detach", tree, commit)
  names, log = [], os.path.join(work, "log.txt")
  results = os.path.join(tree, RESULTS_DIR)
  before = set(os.listdir(results)) if os.path.isdir(results) else set()  # HEAD's records
  try:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
    with open(log, "w") as f:
      print(f"rerun: at {commit[:10]} in {tree}; log in {log}", flush=True)
      proc = subprocess.run(
        argv, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
      )
  finally:
    try:  # a record the run wrote outlives the worktree, whatever happened after it
      names = _keep_record(tree, before, new_name, kept)
    finally:
      git._git(repo, "worktree", "remove", "--force", tree, check=False)
  made = f"{new_name}.json" in names
  if proc.returncode != 0 and made:
    raise RerunError(
      f"the rerun exited with status {proc.returncode} after writing its record: kept in "
      f"{kept} (not in {RESULTS_DIR}: copy it there if {log} shows it sound; its last line: "
      f"{_last_line(log)!r})"
    )
  if proc.returncode != 0 or not made:
    raise RerunError(
      f"the rerun exited with status {proc.returncode} and wrote no record {new_name}: "
      f"{_last_line(log)!r} (the last line of {log})"
    )
  return names


def _last_line(log: str, limit: int = 300) -> str:
  """The last non-blank line of the run's log (its error, usually), at most `limit` characters."""
  try:
    with open(log, "rb") as f:
      f.seek(max(0, os.path.getsize(log) - 8192))
      lines = f.read().decode("utf-8", "replace").splitlines()
  except OSError:
    return ""
  last = next((line.strip() for line in reversed(lines) if line.strip()), "")
  return last if len(last) <= limit else last[: limit - 3] + "..."


def _copy_in(kept: str, names: Sequence[str], results: str) -> None:
  """Copies the kept record files into `results`, never over an existing file."""
  there = [fn for fn in names if os.path.exists(os.path.join(results, fn))]
  if there:
    raise RerunError(
      f"{', '.join(there)} appeared in {results} while the rerun ran: the rerun's record is "
      f"kept in {kept}: copy it into {RESULTS_DIR} once that name is free"
    )
  for fn in sorted(names, key=lambda fn: fn.endswith(".json")):  # the record last
    with open(os.path.join(kept, fn), "rb") as fin, open(os.path.join(results, fn), "xb") as out:
      shutil.copyfileobj(fin, out)


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
  old, taken = _load(name, results)
  chosen, new_name = new_name, new_name or next_name(name, taken)
  if new_name in taken:
    _refuse_taken(results, new_name)
  if not record.NAME_RE.match(new_name):
    raise RerunError(f"record name {new_name!r}: use lowercase letters, digits, '_', '.', '-'")
  scratch = os.path.abspath(scratch or os.path.join(tempfile.gettempdir(), "setdiff_rerun"))
  settings, command = settings or {}, old.get("command") or ""

  def plan(new_name: str) -> List[str]:
    out = os.path.join(scratch, new_name, "out")
    return plan_command(command, new_name, out, settings, unset, repo)

  argv = plan(new_name)
  _check_set_flags(command, settings, repo)
  if dry_run:
    print("rerun: " + shlex.join(argv), flush=True)
    return None
  # The worktree runs HEAD: an uncommitted edit would not run. New records (and the tables
  # generated from them) may wait uncommitted: several reruns are committed together.
  commit = provenance.clean_commit(repo, exclude=(RESULTS_DIR, DOCS_DIR))
  note = f"rerun of {name} (pid {os.getpid()}) under {scratch}\n"
  while True:  # another rerun may have claimed the name since `taken` was read
    try:
      claim = _claim(results, new_name, note)
      break
    except FileExistsError:
      if chosen:
        _refuse_taken(results, new_name)
      taken.append(new_name)
      new_name = next_name(name, taken)
  try:
    argv = plan(new_name)
    print("rerun: " + shlex.join(argv), flush=True)
    work = os.path.join(scratch, new_name)
    names = _run(argv, repo, commit, work, new_name, timeout_s)
    _copy_in(os.path.join(work, "record"), names, results)
  finally:
    if os.path.exists(claim):
      os.remove(claim)
  new = record.read_record(os.path.join(results, f"{new_name}.json"))
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
