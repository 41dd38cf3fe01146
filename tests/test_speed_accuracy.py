"""benchmarks/speed_accuracy.py --quick end to end (tiny models, a few steps: it checks the
pipeline, not the methods), then launch/evaluate.py --eval=accuracy on one of its runs."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # trains four tiny models end to end (~1-1.5 min)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("speed_accuracy")
  spec = importlib.util.spec_from_file_location(
    "speed_accuracy", os.path.join(REPO, "benchmarks", "speed_accuracy.py")
  )
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  record = bench.main(["--quick", f"--output_dir={out}"], log=lambda *a: None)
  return out, record


def test_quick_writes_table_plot_and_json(quick_run):
  out, record = quick_run
  for ext in ("md", "json", "png"):
    path = out / f"speed_accuracy.{ext}"
    assert path.is_file() and path.stat().st_size > 0
  with open(out / "speed_accuracy.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  md = (out / "speed_accuracy.md").read_text()
  assert "| method | W | tau | blocks | accuracy |" in md and "load average" in md
  saved = json.loads((out / "speed_accuracy.json").read_text())
  assert saved["methods"] == ["ar", "mdlm", "bd3lm4", "setdlm4"] and saved["quick"]
  for r in saved["results"]:
    taus = [x["threshold"] for x in r["rows"]]
    assert taus == (["off"] if r["method"] == "ar" else ["off", "0.9"])
    for x in r["rows"]:
      assert 0 <= x["accuracy"] <= 1 and x["num_examples"] == 8
      assert x["tokens_per_step"] >= 1 and x["forward_calls"] >= 1
      assert x["batch1_matches_batched"] is True  # batch 1 decodes the same as the batch


def test_evaluate_accuracy_cli(quick_run):
  out, _ = quick_run
  workdir = out / "runs" / "setdlm4"
  result = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "launch", "evaluate.py"),
      f"--workdir={workdir}",
      "--eval=accuracy",
      "--thresholds=off",
      "--num_examples=3",
      "--accuracy_batch_size=3",
      "--speed_examples=1",
      "--max_new_tokens=20",
    ],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=REPO,
    env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"},
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert (
    "Accuracy (exact match" in result.stdout and "| setdlm | W=4 tau=off | 3 |" in result.stdout
  )
  saved = json.loads((workdir / "eval_results.json").read_text())
  assert saved["accuracy"][0]["num_examples"] == 3 and saved["accuracy"][0]["max_new_tokens"] == 20
  assert saved["accuracy"][0]["decoding"] == "continuous"  # the default; static: the same rows
  static = subprocess.run(
    result.args + ["--nocontinuous"],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=REPO,
    env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"},
  )
  assert static.returncode == 0, static.stderr[-2000:]
  again = json.loads((workdir / "eval_results.json").read_text())["accuracy"][0]
  assert again["decoding"] == "static"
  for key in ("num_correct", "mean_generated_tokens", "forward_calls", "kept_tokens_per_step"):
    assert again[key] == saved["accuracy"][0][key], key


@pytest.fixture(scope="module")
def quick_policies(tmp_path_factory):
  out = tmp_path_factory.mktemp("speed_accuracy_policies")
  spec = importlib.util.spec_from_file_location(
    "speed_accuracy_p", os.path.join(REPO, "benchmarks", "speed_accuracy.py")
  )
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  record = bench.main(
    ["--quick", "--policies=entropy_bound", f"--output_dir={out}"], log=lambda *a: None
  )
  return out, record


def test_quick_policies_table_and_pairs(quick_policies):
  out, record = quick_policies
  md = (out / "speed_accuracy_policies.md").read_text()
  assert "| task | method | W | policy | chosen (per seed) |" in md
  saved = json.loads((out / "speed_accuracy_policies.json").read_text())
  rows = saved["summary"]
  assert {(r["task"], r["method"], r["policy"]) for r in rows} == {
    (t, m, p)
    for t in ("chain",)
    for m in ("bd3lm4", "setdlm4")
    for p in ("threshold", "entropy_bound")
  }
  for r in rows:
    assert r["num_test"] == 8 and 0 <= r["accuracy"] <= 1 and r["kept_tokens_per_call"] > 0
    lo, hi = r["speedup_ci"]
    assert lo <= r["speedup"] <= hi
    if r["policy"] == "threshold":  # tau off against itself
      assert r["acc_diff"] == 0 and r["speedup"] == 1
  for rec in saved["records"]:
    assert len(rec["per_example"]["correct"]) == 8 and len(rec["val"]) >= 1
