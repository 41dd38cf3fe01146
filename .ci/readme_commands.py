r"""Runs the README's marked command blocks, as written, in a fresh copy of the repository.

  python .ci/readme_commands.py                      # every marked block, in README order
  python .ci/readme_commands.py --only=quickstart,sampling --keep
  python .ci/readme_commands.py --list
  SETDIFF_README_STEPS=2 python .ci/readme_commands.py   # training cut to 2 steps (the test)

A block runs when the line before its fence is `<!-- readme-run: ID -->` (`<!-- readme-run: ID
install -->`: an installation step, run only with --with_install, in the Python environment this
script runs in, so give it a fresh venv). Each block is one `bash -e -o pipefail` script run in
the copy's root (tracked and untracked, not ignored, files of this checkout; no ../shared beside
it), blocks in README order so that later ones use the runs earlier ones made (`runs/...`).
Without --with_install the copy's package is put first on PYTHONPATH instead.

SETDIFF_README_STEPS=N appends step limits to every `python launch/train.py` / `launch/rl.py`
command (training steps, eval and checkpoint cadence N, one eval batch, no eval samples); nothing
else changes. Each block's output goes to `readme_runs/ID.log` in the copy; the script prints one
line per block (status and wall seconds) and exits 1 at the first failure, after its log's tail.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = re.compile(r"^<!-- readme-run: ([\w-]+)( install)? -->\n```(\w+)\n(.*?)^```", re.M | re.S)
STEPS_ENV = "SETDIFF_README_STEPS"


def blocks(readme_text: str) -> list[tuple[str, bool, str]]:
  """(id, is_install, bash text) of each marked block, in order; a marked block that is not
  fenced `bash` is an error (the mark promises a shell script)."""
  out = []
  for m in MARK.finditer(readme_text):
    if m.group(3) != "bash":
      raise ValueError(f"README block {m.group(1)!r} is marked to run but fenced {m.group(3)!r}")
    out.append((m.group(1), bool(m.group(2)), m.group(4)))
  ids = [b[0] for b in out]
  if len(set(ids)) != len(ids):
    raise ValueError(f"README run marks repeat an id: {ids}")
  return out


def step_flags(launcher: str, steps: int) -> str:
  if launcher == "train":
    return (
      f" --config.num_train_steps={steps} --config.eval_every_steps={steps}"
      f" --config.checkpoint_every_steps={steps} --config.num_eval_steps=1"
      " --config.num_eval_samples=0"
    )
  return f" --config.num_train_steps={steps} --config.checkpoint_every_steps={steps}"


def limit_steps(script: str, steps: int) -> str:
  """The script with step limits on its training commands (continuation lines joined first;
  the flags go before a trailing comment)."""
  lines = script.replace("\\\n", " ").splitlines()
  out = []
  for line in lines:
    m = re.match(r"^(\s*python launch/(train|rl)\.py\b[^#]*?)(\s+#.*)?$", line)
    if m:
      line = m.group(1) + step_flags(m.group(2), steps) + (m.group(3) or "")
    out.append(line)
  return "\n".join(out) + "\n"


def fresh_copy(dest: str) -> str:
  """The checkout's tracked and untracked (not ignored) files, copied to dest."""
  files = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    cwd=REPO,
    capture_output=True,
    check=True,
  ).stdout.split(b"\0")
  for name in (f.decode() for f in files if f):
    src = os.path.join(REPO, name)
    if not os.path.isfile(src):  # deleted in the work tree
      continue
    os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
    shutil.copy2(src, os.path.join(dest, name))
  return dest


def run_blocks(selected, copy: str, *, with_install: bool, steps: int | None, log=print) -> bool:
  env = dict(os.environ)
  if not with_install:
    env["PYTHONPATH"] = copy + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  logs = os.path.join(copy, "readme_runs")
  os.makedirs(logs, exist_ok=True)
  for block_id, _, script in selected:
    venv = os.path.join(copy, ".venv", "bin")
    if with_install and os.path.isdir(venv):  # an install block made it: later blocks use it
      env["PATH"] = venv + os.pathsep + os.environ.get("PATH", "")
      env["VIRTUAL_ENV"] = os.path.dirname(venv)
    if steps:
      script = limit_steps(script, steps)
    path = os.path.join(logs, f"{block_id}.log")
    t0 = time.perf_counter()
    with open(path, "w") as f:
      proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=copy,
        env=env,
        stdout=f,
        stderr=subprocess.STDOUT,
      )
    seconds = time.perf_counter() - t0
    if proc.returncode:
      tail = open(path).read().splitlines()[-40:]
      log(f"{block_id}: FAILED (exit {proc.returncode}) after {seconds:.0f} s; {path}:")
      log("\n".join("  " + t for t in tail))
      return False
    log(f"{block_id}: ok in {seconds:.0f} s")
  return True


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--readme", default=os.path.join(REPO, "README.md"))
  p.add_argument("--only", default="", help="comma-separated block ids (default: all)")
  p.add_argument("--list", action="store_true", help="print the marked blocks and stop")
  p.add_argument("--with_install", action="store_true", help="run the install blocks too")
  p.add_argument("--copy_dir", default="", help="where to copy the repository (default: temp)")
  p.add_argument("--keep", action="store_true", help="keep the copy (default: removed if ok)")
  args = p.parse_args(argv)
  with open(args.readme, encoding="utf-8") as f:
    marked = blocks(f.read())
  if args.list:
    for block_id, install, script in marked:
      print(f"== {block_id}{' (install)' if install else ''}\n{script}")
    return 0
  only = [s for s in args.only.split(",") if s]
  unknown = set(only) - {b[0] for b in marked}
  if unknown:
    print(f"error: --only names no marked block: {sorted(unknown)}", file=sys.stderr)
    return 2
  selected = [b for b in marked if (not only or b[0] in only) and (args.with_install or not b[1])]
  steps = int(os.environ[STEPS_ENV]) if os.environ.get(STEPS_ENV) else None
  copy = args.copy_dir or tempfile.mkdtemp(prefix="setdiff_readme_")
  fresh_copy(copy)
  print(
    f"copy: {copy}; blocks: {', '.join(b[0] for b in selected)}; steps: {steps or 'as written'}"
  )
  ok = run_blocks(selected, copy, with_install=args.with_install, steps=steps)
  if ok and not args.keep and not args.copy_dir:
    shutil.rmtree(copy, ignore_errors=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
