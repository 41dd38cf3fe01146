"""Runs a bounded check's sections one at a time, each in a child process, and never loses a row.

The machinery of `benchmarks/accelerator_check.py` (which owns the sections and the report):

- `plan`: the sections in priority order with their limits. A section whose limit fits in the
  budget after the earlier ones' always starts; a later one starts only on the time the earlier
  ones leave.
- `prepare_output_dir`: a new folder or one without results (a second run into it would replace
  the first's files: refused with one `error:` line).
- `child_main`: one section in the child; each row is appended to OUT/results.jsonl (one write,
  flushed to disk) the moment it is measured, the summary goes to WORK/NAME.json at the end.
- `Runner.run`: the child in its own process group (it and whatever it starts, such as the
  official torch worker), killed at its limit; the group is gone before the next section starts,
  so no two sections ever share the accelerator.
- `Stop`: SIGTERM / SIGINT to the driver kill the running section's group at once; the driver then
  starts nothing more and writes what it has.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback

from benchmarks import inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_JSONL = "results.jsonl"


def plan(order, limits: dict, budget: float) -> list:
  """[{section, limit_s, start_s, in_budget}]: each section's latest start if every earlier one
  runs to its limit, and whether its own limit still fits in `budget` from there."""
  out, start = [], 0.0
  for name in order:
    out.append(
      {
        "section": name,
        "limit_s": limits[name],
        "start_s": start,
        "in_budget": start + limits[name] <= budget,
      }
    )
    start += limits[name]
  return out


def plan_text(steps: list, budget: float, min_start: float) -> str:
  """The plan as printed before the run."""
  inside = [f"{s['section']} {s['limit_s']:g} s" for s in steps if s["in_budget"]]
  beyond = [f"{s['section']} {s['limit_s']:g} s" for s in steps if not s["in_budget"]]
  used = sum(s["limit_s"] for s in steps if s["in_budget"])
  text = f"plan (budget {budget:g} s, in priority order): {', '.join(inside)} ({used:g} s)"
  if beyond:
    text += (
      f"; beyond the budget, each started only on the time the sections before it leave (at "
      f"least {min_start:g} s or its whole limit), else listed as not started: {', '.join(beyond)}"
    )
  return text


def prepare_output_dir(path: str, owned: tuple) -> None:
  """Creates `path`, or accepts it when it holds none of the files `owned` (the check's own);
  SystemExit with one `error:` line for a path that is no writable folder or one that holds
  results."""
  try:
    inputs.check_output_dir(path)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  held = [f for f in owned if os.path.exists(os.path.join(path, f))]
  if held:
    raise SystemExit(
      f"error: --output_dir={path} already holds results ({', '.join(held)}); a second run would "
      "replace them: give a new folder (accelerator_run.sh: a new OUT, or SECTIONS=... writes "
      "into its own subfolder)"
    )
  os.makedirs(path, exist_ok=True)


def append_line(path: str, record: dict) -> None:
  """One JSON line appended with a single write, flushed to disk (a reader, or a kill, sees whole
  lines only)."""
  line = (json.dumps(record, default=float) + "\n").encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, line)
    os.fsync(fd)
  finally:
    os.close(fd)


def section_rows(path: str, name: str) -> list:
  """The rows section `name` appended to the results.jsonl at `path` (each with its `table`)."""
  if not os.path.exists(path):
    return []
  rows = []
  for line in open(path):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:  # never expected (whole lines only): skipped, not fatal
      continue
    if record.get("section") == name and "table" in record:
      rows.append({k: v for k, v in record.items() if k != "section"})
  return rows


def child_main(args, runners: dict) -> None:
  """Runs section `args.child` (runners[name](args, emit, left) -> summary dict)."""
  name = args.child
  rows_path = os.path.join(args.output_dir, RESULTS_JSONL)

  def emit(table, row):
    append_line(rows_path, {"section": name, "table": table, **row})
    print(f"{name}: {json.dumps(row, default=float)[:300]}", flush=True)

  def left():
    return args.deadline - time.time()

  try:
    summary = runners[name](args, emit, left)
  except Exception as e:  # recorded; the driver reports it and runs the next section
    summary = {
      "error": f"{type(e).__name__}: {e}"[:500],
      "traceback": traceback.format_exc()[-3000:],
    }
  with open(os.path.join(args.work, f"{name}.json"), "w") as f:
    json.dump(summary, f, default=float)


class Stop:
  """The driver's SIGTERM / SIGINT handler: remembers the first signal and kills the running
  section's process group (`pgid`) at once. Nothing is raised: the driver notices `signum`, starts
  no more sections and writes what it has."""

  def __init__(self):
    self.signum = None
    self.pgid = None
    self._previous = {}

  def __call__(self, signum, frame):
    self.signum = self.signum or signum
    kill_group(self.pgid)

  def reason(self) -> str:
    return f"the driver got {signal.Signals(self.signum).name}"

  def __enter__(self):
    for s in (signal.SIGTERM, signal.SIGINT):
      self._previous[s] = signal.signal(s, self)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


def kill_group(pgid) -> None:
  if pgid is not None:
    try:
      os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass


def end_group(proc, wait_s: float = 3.0) -> None:
  """Kills the child's process group (what it started too), reaps the child and waits up to
  `wait_s` for the rest of the group to be gone (their accelerator memory with them)."""
  kill_group(proc.pid)
  proc.wait()
  until = time.time() + wait_s
  while time.time() < until:
    try:
      os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
      return
    time.sleep(0.05)


class Runner:
  """Starts the sections of `module` (`python -m module *child_argv --child=NAME ...`) one at a
  time; `section_env`: {name: extra environment of that section's child}."""

  def __init__(self, module, child_argv, output_dir, work, log, stop: Stop, section_env=None):
    self.cmd = [sys.executable, "-m", module, *child_argv]
    self.output_dir, self.work, self.log, self.stop = output_dir, work, log, stop
    self.section_env = section_env or {}

  def run(self, name: str, limit: float) -> dict:
    """Section `name` in a child process killed at `limit` seconds (or by the stop signal):
    {section, status, seconds, summary, rows}."""
    cmd = self.cmd + [f"--child={name}", f"--work={self.work}", f"--deadline={time.time() + limit}"]
    t0 = time.perf_counter()
    self.log.write(f"\n===== {name} (limit {limit:.0f} s)\n")
    self.log.flush()
    env = dict(os.environ, **self.section_env.get(name, {}))
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    proc = subprocess.Popen(
      cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, **group
    )
    self.stop.pgid = proc.pid
    if self.stop.signum:  # a signal between the start and the line above
      kill_group(proc.pid)
    status = "ok"
    try:
      rc = proc.wait(timeout=limit)
      if rc != 0:
        status = f"error: the child exited with {rc} (check.log)"
    except subprocess.TimeoutExpired:
      status = f"cut at its {limit:.0f} s limit"
    self.stop.pgid = None
    end_group(proc)
    summary = self.summary(name)
    if self.stop.signum:
      status = f"cut: {self.stop.reason()}"
    elif "error" in summary:
      status = "error: " + summary["error"]
    elif "skipped" in summary:
      status = "skipped: " + summary["skipped"]
    rows = section_rows(os.path.join(self.output_dir, RESULTS_JSONL), name)
    seconds = time.perf_counter() - t0
    return {"section": name, "status": status, "seconds": seconds, "summary": summary, "rows": rows}

  def summary(self, name: str) -> dict:
    path = os.path.join(self.work, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else {}


__all__ = [
  "ROOT",
  "RESULTS_JSONL",
  "plan",
  "plan_text",
  "prepare_output_dir",
  "append_line",
  "section_rows",
  "child_main",
  "Stop",
  "kill_group",
  "end_group",
  "Runner",
]
