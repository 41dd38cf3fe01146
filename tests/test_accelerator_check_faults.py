"""benchmarks/accelerator_check.py when things go wrong: a driver killed mid-section (the run
script's `timeout`, a lease ending, Ctrl-C) keeps the rows measured so far, writes its table and
leaves no section running; a second run into a folder with results is refused; the official
section starts the torch worker with no JAX backend holding accelerator memory; relative paths
reach the children (cwd = the repository root) as absolute ones."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import accelerator_check, official, section_runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The driver, reporting at exit whether it ever imported JAX (it must hold no accelerator memory).
DRIVER = """
import sys
from benchmarks import accelerator_check
try:
  accelerator_check.main(sys.argv[1:])
finally:
  print("driver imported jax:", "jax" in sys.modules, flush=True)
"""


def wait_for_row(path, table: str, timeout: float = 120.0) -> dict:
  """The first row of `table` in the results.jsonl at `path`, once a child has written it."""
  until = time.time() + timeout
  while time.time() < until:
    if os.path.exists(path):
      rows = [json.loads(x) for x in open(path) if x.strip()]
      found = [r for r in rows if r.get("table") == table]
      if found:
        return found[0]
    time.sleep(0.2)
  raise AssertionError(f"no {table} row reached {path} in {timeout:.0f} s")


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_killed_driver_keeps_its_rows_writes_its_table_and_kills_the_section(tmp_path, signum):
  """The test-only `sleep` section writes a row, then sleeps (limit 600 s). The driver, run from
  another folder with a relative --output_dir, gets `signum` mid-section: the row is already in
  OUT/results.jsonl, the section's child is gone at once, the section is recorded as cut by the
  signal in results.jsonl, results.json and table.md (the device section's result too), and the
  driver exits 128 + signum without ever having imported JAX."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  argv = ["--tiny", "--sections=sleep", "--timeouts=sleep=600,device=120", "--budget_s=900"]
  driver = subprocess.Popen(
    [sys.executable, "-c", DRIVER, *argv, "--output_dir=rel"],
    cwd=tmp_path,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  out = tmp_path / "rel"
  child = None
  try:
    child = wait_for_row(out / "results.jsonl", "sleep")["pid"]
    assert alive(child)
    driver.send_signal(signum)
    printed, _ = driver.communicate(timeout=60)
  finally:  # a failing test leaves nothing of its own running
    for pid in (driver.pid, child):
      if pid and alive(pid):
        os.kill(pid, signal.SIGKILL)
  name = signal.Signals(signum).name
  assert driver.returncode == 128 + signum, printed
  assert "driver imported jax: False" in printed
  assert not alive(child)
  lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
  assert {"section": "sleep", "table": "sleep", "slept": 0, "pid": child} in lines
  status = {x["section"]: x["status"] for x in lines if "status" in x}
  assert status == {"device": "ok", "sleep": f"cut: the driver got {name}"}
  results = json.loads((out / "results.json").read_text())
  assert results["sleep"]["rows"][0]["pid"] == child
  table = (out / "table.md").read_text()
  assert f"sleep: cut: the driver got {name}" in table and "device: ok" in table


def test_a_second_run_into_a_folder_with_results_is_refused(tmp_path):
  """A folder that holds the check's results is refused with one error line naming it and the
  fix, before anything runs, and its files stay as they were; a folder with other files only
  (the run script's machine.txt) is accepted."""
  out = tmp_path / "out"
  out.mkdir()
  (out / "results.jsonl").write_text("earlier\n")
  argv = ["--tiny", "--sections=sleep", "--timeouts=sleep=1", f"--output_dir={out}"]
  with pytest.raises(SystemExit) as e:
    accelerator_check.main(argv)
  message = str(e.value)
  assert message.startswith(f"error: --output_dir={out} already holds results (results.jsonl)")
  assert "give a new folder" in message and message.count("error:") == 1
  assert os.listdir(out) == ["results.jsonl"] and (out / "results.jsonl").read_text() == "earlier\n"
  other = tmp_path / "other"
  other.mkdir()
  (other / "machine.txt").write_text("gpu")
  section_runner.prepare_output_dir(str(other), accelerator_check.RESULT_FILES)


OFFICIAL_SECTION = """
import json, sys
from jax._src import xla_bridge
from benchmarks import accelerator_check, official

seen, rows = {}, []
REPLIES = {
  "info": {"torch": "2", "transformers": "4.52.4", "python": "python"},
  "prepare_train": {"clean": 128.0},
  "time_train": {"seconds": 0.5, "loss": 10.0},  # 2 steps at --tiny: 250 ms per step
  "prepare_decode": {},
  "time_decode": {"tokens": 10, "seconds": 0.5},  # 20 tokens/s: 50 ms per token
}


class Worker:  # stands in for the torch worker
  def __init__(self, oargs, argv):
    seen.update(backend_at_start=bool(xla_bridge._backends), device=oargs.device)

  def __call__(self, cmd, **kw):
    return REPLIES[cmd]

  def close(self):
    pass


official.OfficialWorker = Worker
args = accelerator_check.parse_args(sys.argv[1:])
accelerator_check.section_official(args, lambda table, row: rows.append(row), lambda: 100.0)
seen["backend_at_end"] = bool(xla_bridge._backends)
print(json.dumps({"seen": seen, "rows": rows}))
"""


def test_the_official_section_starts_its_worker_with_no_jax_backend(tmp_path):
  """On a GPU, a JAX client takes 75 % of the memory when it starts: the official section's child
  takes the backend from the device section (device.json) and initialises none, so the torch
  worker has the accelerator to itself; its environment also turns JAX's preallocation off (the
  fallback when the device section left no backend). Its rows name their units: ms per step on
  the training rows, ms per token on the decoding rows."""
  tree = tmp_path / "setdlms"
  for name in official.REQUIRED_FILES:
    (tree / name).parent.mkdir(parents=True, exist_ok=True)
    (tree / name).write_text("")
  work = tmp_path / "work"
  work.mkdir()
  (work / "device.json").write_text(json.dumps({"backend": "gpu"}))
  argv = ["--tiny", f"--official={tree}", f"--work={work}"]
  r = subprocess.run(
    [sys.executable, "-c", OFFICIAL_SECTION, *argv],
    cwd=ROOT,
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["seen"] == {"backend_at_start": False, "device": "cuda", "backend_at_end": False}
  assert accelerator_check.SECTION_ENV["official"] == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  units = {r["work"]: {k for k in r if k.startswith("official_ms")} for r in out["rows"]}
  assert units == {
    "train setdlm b8 bf16": {"official_ms_per_step"},
    "train ar b8 bf16": {"official_ms_per_step"},
    "decode setdlm4 b1 fp32": {"official_ms_per_token"},
    "decode ar b1 fp32": {"official_ms_per_token"},
  }
  ms = {
    r["work"]: r.get("official_ms_per_step", r.get("official_ms_per_token")) for r in out["rows"]
  }
  assert ms["train ar b8 bf16"] == pytest.approx(250.0) and ms["decode ar b1 fp32"] == 50.0


def test_relative_paths_reach_the_children_absolute(tmp_path, monkeypatch):
  """The children run with cwd = the repository root: --output_dir, --official and a path given as
  --official_python reach them absolute (a bare name stays a name to look up on PATH)."""
  monkeypatch.chdir(tmp_path)
  args = accelerator_check.parse_args(
    ["--output_dir=out", "--official=tree", "--official_python=venv/bin/python"]
  )
  assert args.output_dir == str(tmp_path / "out") and args.official == str(tmp_path / "tree")
  assert args.official_python == str(tmp_path / "venv" / "bin" / "python")
  assert accelerator_check.child_argv(args)[:1] == [f"--output_dir={tmp_path / 'out'}"]
  assert f"--official={tmp_path / 'tree'}" in accelerator_check.child_argv(args)
  assert accelerator_check.parse_args(["--official_python=python3"]).official_python == "python3"
