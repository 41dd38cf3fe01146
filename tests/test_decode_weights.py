"""benchmarks/decode_weights.py: the summary on hand-made outcomes, the checks on its inputs, and
(slow tier) a --quick tuned run decoded again in fp32 (which must give the tuned outcomes back,
problem by problem) and in bf16."""

import json

import numpy as np
import pytest

from benchmarks import decode_weights as dw
from benchmarks import tuned_baselines as tb


def _row(setting, c32, c16, same, kept=(2, 2, 2, 2), calls=(1, 1, 2, 2)):
  return {
    "setting": setting,
    "same_output": list(same),
    "correct_fp32": list(c32),
    "correct_bf16": list(c16),
    "kept_fp32": list(kept),
    "kept_bf16": list(kept),
    "calls_fp32": list(calls),
    "calls_bf16": list(calls),
    "fp32_equals_record": True,
  }


def test_summary_counts_unchanged_outputs_and_pairs_the_accuracies():
  outcomes = {
    "arithmetic": {
      "setdlm4": {
        0: [_row("W=4 tau=off", [1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 1, 0])],
        1: [_row("W=4 tau=off", [1, 0, 1, 0], [0, 0, 1, 0], [0, 1, 1, 1], kept=(3, 3, 0, 0))],
      }
    }
  }
  s = dw.summarize(outcomes, n_boot=200)
  (r,) = s["rows"]
  assert (r["unchanged"], r["decoded"], r["problems_per_seed"]) == (5, 8, 4)
  assert r["acc_fp32_per_seed"] == [0.5, 0.5] and r["acc_bf16_per_seed"] == [0.5, 0.25]
  assert r["difference"]["point"] == pytest.approx(-0.125)  # bf16 - fp32, mean over seeds
  assert r["difference"]["lo"] <= -0.125 <= r["difference"]["hi"]
  assert r["difference"]["p_holm"] == pytest.approx(r["difference"]["p"])  # one row
  # kept tokens per call: seed 0 8 / 6, seed 1 6 / 6, then the mean over seeds
  assert r["kept_tokens_per_call_fp32"] == pytest.approx((8 / 6 + 1.0) / 2)
  assert not s["all_outputs_unchanged"]
  md = dw.report_markdown({"summary": s, "tuned": [{"task": "arithmetic", "commit": "abc"}]})
  assert "5/8 (62.5 %)" in md and "-12.5" in md and "fp32 stays the default" in md


def test_every_output_unchanged_makes_bf16_the_default_verdict():
  same = [1, 1, 1, 1]
  outcomes = {
    "chain": {"bd3lm4": {s: [_row("tau=off", [1, 0, 1, 1], [1, 0, 1, 1], same)] for s in (0, 1)}}
  }
  s = dw.summarize(outcomes, n_boot=100)
  assert s["all_outputs_unchanged"] and s["rows"][0]["difference"]["point"] == 0.0
  md = dw.report_markdown({"summary": s, "tuned": [{"task": "chain", "commit": "abc"}]})
  assert "can be the default" in md


def test_fp32_outcomes_are_checked_against_the_tuned_record_problem_by_problem():
  rows = [_row("tau=off", [1, 0], [1, 1], [1, 0]), _row("tau=0.9", [1, 1], [1, 1], [1, 1])]
  saved = [
    {"setting": "tau=off", "values": [1.0, 0.0]},
    {"setting": "tau=0.9", "values": [1.0, 0.0]},
  ]
  assert dw.reproduces(rows, saved) == {"tau=off": True, "tau=0.9": False}


def test_inputs_that_are_not_a_finished_tuned_task_run_are_refused(tmp_path):
  with pytest.raises(ValueError, match="tuned_baselines.json not found"):
    dw.load_tuned(str(tmp_path))
  (tmp_path / "tuned_baselines.json").write_text(json.dumps({"plan": {"task": "corpus"}}))
  with pytest.raises(ValueError, match="corpus run"):
    dw.load_tuned(str(tmp_path))
  with pytest.raises(ValueError, match="no finished training run"):
    dw.run_dir(str(tmp_path), {"task": "chain"}, "setdlm4", 2e-3, 0)


def test_only_the_methods_own_window_is_decoded():
  p = {"thresholds": [None, 0.9]}
  assert [st.name for st in dw.own_window_settings("setdlm4", p)] == ["W=4 tau=off", "W=4 tau=0.9"]
  assert [st.name for st in dw.own_window_settings("ar", p)] == ["-"]


@pytest.mark.slow
def test_quick_tuned_run_decoded_in_fp32_and_bf16(tmp_path):
  tuned_dir, out = tmp_path / "tuned", tmp_path / "out"
  tb.main(
    [
      "--task=arithmetic",
      "--quick",
      "--methods=setdlm4",
      "--lr_grid=1e-3",
      "--seeds=0,1",
      f"--output_dir={tuned_dir}",
    ],
    log=lambda *a: None,
  )
  record = dw.main([f"--tuned_dirs={tuned_dir}", f"--output_dir={out}"], log=lambda *a: None)
  rows = record["summary"]["rows"]
  assert [r["setting"] for r in rows] == ["W=4 tau=off", "W=4 tau=0.9"]
  for r in rows:
    assert r["fp32_equals_record"]  # the tuned record's own path gives its outcomes back
    assert r["decoded"] == 16 and 0 <= r["unchanged"] <= 16
    assert np.isfinite(r["difference"]["point"])
  saved = json.loads((out / "decode_weights.json").read_text())
  assert saved["markdown"] == (out / "decode_weights.md").read_text()
