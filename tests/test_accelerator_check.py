"""benchmarks/accelerator_check.py --tiny: every section runs on CPU at tiny shapes and reports
(per-section JSON lines, the final JSON and table); the attention implementations agree with
dense. Slow tier (a whole benchmark run)."""

import json
import os
import sys

import pytest

sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
)


@pytest.mark.slow
def test_accelerator_check_tiny(tmp_path, capsys):
  import accelerator_check

  out = str(tmp_path / "check")
  results = accelerator_check.main(["--tiny", f"--out={out}", "--repeats=1"])
  lines = [json.loads(l) for l in open(out + ".jsonl")]
  assert [l["section"] for l in lines] == list(accelerator_check.SECTIONS)
  for name in accelerator_check.SECTIONS:
    assert "error" not in results[name], (name, results[name].get("traceback"))
  assert json.load(open(out + ".json"))["device"]["device_count"] >= 1
  ran = [r for r in results["attention"]["rows"] if "error" not in r]
  assert {r["impl"] for r in ran} >= {"dense", "xla", "blocksparse"}
  for r in ran:  # every implementation computes dense attention's output and gradients
    assert r["max_abs_diff_out"] < 1e-4 and r["max_abs_diff_grad"] < 1e-4, r
  rows = {(r["sampler"], r["batch"]): r for r in results["decode"]["rows"]}
  assert rows[("ar", 1)]["kept_tokens_per_call"] <= 1.0
  assert rows[("setdlm T=N/4", 1)]["kept_tokens_per_call"] > 2.0  # 4 per step, + the prefill
  assert results["train"]["tokens_per_s"] > 0 and results["stack"]["step_ms"] > 0
  assert "| sampler | batch | kept tok/call |" in open(out + ".md").read()
  assert "decode" in capsys.readouterr().out


def test_unknown_section_is_one_error_line(tmp_path):
  import accelerator_check

  with pytest.raises(SystemExit, match="error: --sections='bogus'"):
    accelerator_check.main(["--tiny", "--sections=bogus", f"--out={tmp_path / 'x'}"])
