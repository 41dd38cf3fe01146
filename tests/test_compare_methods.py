"""benchmarks/compare_methods.py --quick end to end, and launch/evaluate.py on one of its runs.

The quick run trains tiny models for a few steps on the corpus's validation split and evaluates
them with one compile per decoder and setting; it checks the pipeline and its outputs, not the
methods. The test runs it in-process for AR, MDLM, BD3LM-4 and SetDLM-2 (every objective and
sampler; SetDLM-4/8 differ from SetDLM-2 only in S).
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import CLOZE_FIXTURE

pytestmark = pytest.mark.slow  # trains four tiny models end to end (~1-1.5 min)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ["ar", "mdlm", "bd3lm4", "setdlm2"]


def _load_benchmark():
  spec = importlib.util.spec_from_file_location(
    "compare_methods", os.path.join(REPO, "benchmarks", "compare_methods.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("compare")
  bench = _load_benchmark()
  record = bench.main(
    [
      "--quick",
      f"--output_dir={out}",
      f"--methods={','.join(METHODS)}",
      f"--cloze_path={CLOZE_FIXTURE}",  # the pipeline, not the scores: the committed stand-in
    ],
    log=lambda *a: None,
  )
  return out, record


def test_quick_writes_table_plot_and_json(quick_run):
  out, record = quick_run
  for name in ("results.md", "results.json", "speed_quality.png"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0
  with open(out / "speed_quality.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  md = (out / "results.md").read_text()
  assert "| method | params |" in md and "Hardware:" in md and "Command:" in md
  for m in METHODS:
    assert f"| {m} |" in md
  with open(out / "results.json") as f:
    saved = json.load(f)
  assert saved["methods"] == METHODS and saved["quick"]
  assert saved["total_seconds"] > 0 and saved["hardware"]["cpu_count"] >= 1


def test_quick_results_are_consistent(quick_run):
  _, record = quick_run
  n = record["plan"]["max_new_tokens"]
  by = {r["method"]: r for r in record["results"]}
  for m, r in by.items():
    lik = r["likelihood"]
    assert lik["num_sequences"] == record["plan"]["max_rows"] and lik["nll"] > 0
    assert lik["K_nll"] <= lik.get("meanK_nll", lik["K_nll"]) + 1e-9
    for s in r["speed"]:
      assert s["tokens_per_second"] > 0 and s["tokens_per_step"] >= 1.0
      if "quality" in s:
        assert s["quality"]["gen_ppl"] > 1 and s["quality"]["num_samples"] >= 1
    for i in r["infill"]:
      assert i["dataset"] == "1sent" and i["num_examples"] == record["plan"]["num_infill"]
      assert 0.0 <= i["rougeL"] <= 100.0
  # Forward calls per row for N new tokens, tau off: AR N; set sampler N + 1 (context encoding);
  # BD3LM N + 1 (prompt encoding, fused block cache); MDLM N (no cache).
  calls = {
    m: [s for s in by[m]["speed"] if s["threshold"] == "off"][0]["forward_calls"] for m in by
  }
  assert calls == {"ar": n, "mdlm": n, "bd3lm4": n + 1, "setdlm2": n + 1}
  assert by["ar"]["likelihood"]["num_draws"] == 1 and by["setdlm2"]["likelihood"]["num_draws"] == 2


def test_launch_evaluate_on_a_run(quick_run, tmp_path):
  out, _ = quick_run
  workdir = out / "runs" / "ar"
  result_file = tmp_path / "eval.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "launch", "evaluate.py"),
      f"--workdir={workdir}",
      "--eval=likelihood,samples",
      "--max_rows=8",
      "--num_samples=2",
      "--batch_sizes=2",
      "--max_new_tokens=8",
      "--thresholds=off",
      f"--judge_workdir={workdir}",
      f"--output={result_file}",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Likelihood" in proc.stdout and "gen PPL" in proc.stdout
  with open(result_file) as f:
    rec = json.load(f)
  assert rec["objective"] == "ar" and rec["likelihood"]["num_sequences"] == 8
  assert rec["samples"][0]["num_samples"] == 2 and rec["samples"][0]["gen_ppl"] > 1


def test_compare_seeds_reads_a_real_report(quick_run):
  """benchmarks/compare_seeds on the quick run's own report, relabelled as three seeds: every
  column it reads exists in what compare_methods writes (the schema, not the statistics)."""
  from benchmarks import compare_seeds

  _, record = quick_run
  runs = [dict(json.loads(json.dumps(record)), seed=s) for s in (0, 1, 2)]
  out = compare_seeds.summarize(runs, "setdlm2")
  for m in METHODS:
    cols = out["summary"][m]
    for c in ("val NLL (1 order)", "tok/step b=2 tau 0.9", "gen PPL tau off", "R-L cloze-1"):
      assert cols[c]["std"] == 0.0 and cols[c]["mean"] == cols[c]["lo"], (m, c)
  assert {r["method"] for r in out["pairs"]} == {"ar", "mdlm", "bd3lm4"}


def test_a_rerun_with_other_settings_is_refused_not_relabelled(quick_run):
  """Probe 9b, finding 8: a rerun into the same --output_dir with another seed / learning rate
  evaluated the old models under the new labels and replaced results.json. Each run keeps its
  training config beside its checkpoints; other settings are refused before anything runs."""
  out, _ = quick_run
  bench = _load_benchmark()
  for m in METHODS:
    assert (out / "runs" / m / bench.FINGERPRINT).is_file()
  before = (out / "results.json").read_text()
  argv = ["--quick", f"--output_dir={out}", f"--methods={','.join(METHODS)}", "--seed=1"]
  with pytest.raises(ValueError, match=r"runs/ar holds a model trained with other settings"):
    bench.main(argv + [f"--cloze_path={CLOZE_FIXTURE}"], log=lambda *a: None)
  assert (out / "results.json").read_text() == before
