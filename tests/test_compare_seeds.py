"""benchmarks/compare_seeds: per-seed compare_methods reports into one table of seed means with
Student-t intervals, the paired differences by hand, and the refusals (too few seeds, a repeated
seed, runs that differ in more than the seed)."""

import json
import math

import pytest

from benchmarks import compare_seeds

PLAN = {"speed_batch_sizes": [1, 8], "num_orders": 4, "steps": 700, "batch_size": 16}


def _result(method, nll, rouge, tau=True):
  speed = []
  for thr in ("off", "0.9") if tau else ("off",):
    for bs in (1, 8):
      row = {"batch_size": bs, "threshold": thr, "tokens_per_step": 1.5 if thr != "off" else 1.0}
      row["tokens_per_second"] = 100.0 * bs
      if bs == 8:
        row["quality"] = {"gen_ppl": 50.0 + nll, "unigram_entropy": 4.0}
      speed.append(row)
  infill = [
    {"dataset": d, "threshold": "off", "rougeL": rouge + i}
    for i, d in enumerate(("1sent", "3sent"))
  ]
  return {
    "method": method,
    "likelihood": {"nll": nll, "K_nll": nll - 0.1},
    "speed": speed,
    "infill": infill,
  }


def _run(seed, ar_nll, set_nll, set_rouge, lrs=None):
  return {
    "command": f"python -m benchmarks.compare_methods --methods=ar,setdlm4 --seed={seed} "
    f"--output_dir=/tmp/s{seed}",
    "commit": "abc",
    "hardware": {"backend": "cpu", "cpu": "test", "cpu_count": 2, "jax": "0.10.2"},
    "seed": seed,
    "methods": ["ar", "setdlm4"],
    "lrs": lrs or {"ar": 4e-3, "setdlm4": 2e-3},
    "plan": PLAN,
    "recipe": "2 x 128",
    "top_p": 1.0,
    "quick": False,
    "results": [_result("ar", ar_nll, 5.0, tau=False), _result("setdlm4", set_nll, set_rouge)],
  }


RUNS = [_run(0, 4.0, 5.0, 7.0), _run(1, 4.3, 5.2, 8.0), _run(2, 4.5, 5.4, 12.0)]


def test_seed_means_intervals_and_paired_differences_by_hand():
  out = compare_seeds.summarize(RUNS, "setdlm4")
  nll = out["summary"]["setdlm4"]["val NLL (1 order)"]
  half = 4.303 * 0.2 / math.sqrt(3)  # t(0.975, 2 df) from a printed table, std 0.2
  assert nll["mean"] == pytest.approx(5.2) and nll["hi"] - nll["mean"] == pytest.approx(half, 1e-3)
  assert out["values"]["ar"]["tok/step b=1 tau 0.9"] == [1.0, 1.0, 1.0]  # AR: the tau-off row
  assert out["summary"]["setdlm4"]["tok/step b=1 tau 0.9"]["mean"] == 1.5
  assert out["summary"]["ar"]["R-L corpus"] is None  # no corpus infill in these runs
  pairs = {(r["method"], r["metric"]): r for r in out["pairs"]}
  assert set(pairs) == {("ar", "val NLL (1 order)"), ("ar", "R-L cloze-1"), ("ar", "R-L cloze-3")}
  d = pairs["ar", "val NLL (1 order)"]  # differences 1.0, 0.9, 0.9
  assert d["point"] == pytest.approx(0.93333, abs=1e-5) and d["p"] < 0.01
  r = pairs["ar", "R-L cloze-1"]  # differences 2, 3, 7: mean 4, std 2.646
  assert r["point"] == pytest.approx(4.0)
  assert r["hi"] - 4.0 == pytest.approx(4.303 * math.sqrt(7) / math.sqrt(3), rel=1e-3)
  assert all(x["p_holm"] >= x["p"] for x in out["pairs"])


def test_refusals_name_the_difference():
  with pytest.raises(ValueError, match=">= 3"):
    compare_seeds.summarize(RUNS[:2], "setdlm4")
  with pytest.raises(ValueError, match="repeat"):
    compare_seeds.summarize([RUNS[0], RUNS[1], _run(1, 4.0, 5.0, 7.0)], "setdlm4")
  other_lr = _run(2, 4.5, 5.4, 12.0, lrs={"ar": 1e-3, "setdlm4": 2e-3})
  with pytest.raises(ValueError, match="'lrs'"):
    compare_seeds.summarize(RUNS[:2] + [other_lr], "setdlm4")
  steps = dict(RUNS[2], command=RUNS[2]["command"] + " --steps=100")
  with pytest.raises(ValueError, match="command differs"):
    compare_seeds.summarize(RUNS[:2] + [steps], "setdlm4")
  with pytest.raises(ValueError, match="--against=mdlm"):
    compare_seeds.summarize(RUNS, "mdlm")


def test_main_reads_files_and_writes_the_table(tmp_path):
  refs = []
  for run in RUNS:
    path = tmp_path / f"s{run['seed']}.json"
    path.write_text(json.dumps(run))
    refs.append(str(path))
  out = tmp_path / "out"
  report = compare_seeds.main(
    [f"--runs={','.join(refs)}", f"--output_dir={out}"], log=lambda *a: None
  )
  written = json.loads((out / "compare_seeds.json").read_text())
  assert written["seeds"] == [0, 1, 2] and written["markdown"] == report["markdown"]
  assert written["hardware"]["cpu"] == "test"  # docs/results shows the device
  assert "5.200 ± 0.200" in report["markdown"] and "setdlm4 - ar" in report["markdown"]
  with pytest.raises(ValueError, match="no file"):
    compare_seeds.main([f"--runs={tmp_path}/nope.json,a,b"], log=lambda *a: None)
