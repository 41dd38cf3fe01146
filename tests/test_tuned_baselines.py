"""benchmarks/tuned_baselines.py (issue 35): the learning-rate choice, the seed-aware summary and
its comparisons on hand-made outcomes, the plan's checks, and (slow tier) a --quick run end to end
that chooses on validation, measures every seed once and reruns from its caches."""

import json

import numpy as np
import pytest

from benchmarks import tuned_baselines as tb


def _plan(task="arithmetic", **kw):
  argv = [f"--task={task}", "--quick", *[f"--{k}={v}" for k, v in kw.items()]]
  return tb.plan(tb.parse_args(argv))


def test_choose_lr_best_validation_ties_to_the_smaller():
  assert tb.choose_lr({1e-3: 0.5, 2e-3: 0.7, 4e-3: 0.7}, lower_is_better=False) == 2e-3
  assert tb.choose_lr({1e-3: 2.1, 2e-3: 1.9, 4e-3: 2.0}, lower_is_better=True) == 2e-3
  assert tb.choose_lr({4e-3: 0.5, 1e-3: 0.5}, lower_is_better=False) == 1e-3


def test_the_grid_widens_only_where_the_optimum_sits_strictly_best_on_an_edge():
  grid = {1e-3: 0.81, 2e-3: 0.17, 4e-3: 0.03}
  assert tb.widened(grid, lower_is_better=False) == pytest.approx(5e-4)
  assert tb.widened({1e-3: 0.1, 2e-3: 0.5, 4e-3: 0.9}, False) == pytest.approx(8e-3)
  assert tb.widened({1e-3: 2.0, 2e-3: 1.0, 4e-3: 1.5}, True) is None  # inside
  assert tb.widened({1e-3: 0.0, 2e-3: 0.0, 4e-3: 0.0}, False) is None  # flat: says nothing
  assert tb.widened({1e-3: 1.9, 2e-3: 2.0}, True) == pytest.approx(5e-4)  # NLL: lower is better
  assert tb.widened({1e-3: 0.5}, False) is None


def test_choose_with_widening_tries_outward_at_most_widen_times():
  curve = {5e-4: 0.86, 2.5e-4: 0.90, 1.25e-4: 0.88}  # the optimum two steps below the grid
  scored, logs = [], []

  def score(lr):
    scored.append(lr)
    return {1e-3: 0.81, 2e-3: 0.17, 4e-3: 0.03}.get(lr, curve.get(float(f"{lr:.3g}")))

  p = _plan(widen=2)
  out = tb.choose_with_widening("bd3lm4", p, score, False, logs.append)
  assert scored == [1e-3, 2e-3, 4e-3, 5e-4, 2.5e-4] and out["chosen"] == 2.5e-4
  assert list(out["val"]) == ["0.00025", "0.0005", "0.001", "0.002", "0.004"]
  assert "also trying lr 0.0005" in logs[0]
  assert tb.choose_with_widening("x", _plan(widen=0), score, False, print)["chosen"] == 1e-3


def test_plan_checks_the_splits_and_the_lr_seed():
  with pytest.raises(ValueError, match="held-out problems"):
    _plan(num_val=150, num_test=107)
  with pytest.raises(ValueError, match="--lr_seed 3"):
    _plan(lr_seed=3, seeds="0,1")
  assert _plan(task="chain", methods="bd3lm4,setdlm4")["methods"] == ["bd3lm4", "setdlm4"]
  for one in ("0", "1,1"):  # refused before training (the summary's intervals resample seeds)
    with pytest.raises(ValueError, match=f"--seeds={one}: .* at least two different ones"):
      _plan(seeds=one)


def _rows(settings, values):
  return [{"setting": s, "score": float(np.mean(v)), "values": v} for s, v in zip(settings, values)]


def test_summary_means_intervals_and_holm_on_hand_made_outcomes():
  p = _plan(methods="ar,bd3lm4,setdlm4", seeds="0,1", bootstrap=300)
  set_s = ["W=4 tau=off", "W=4 tau=0.9", "W=8 tau=off", "W=8 tau=0.9"]
  per_seed = {
    "ar": {0: _rows(["-"], [[1, 1, 1, 0]]), 1: _rows(["-"], [[1, 1, 0, 0]])},
    "bd3lm4": {
      0: _rows(["tau=off", "tau=0.9"], [[0, 0, 1, 0], [0, 0, 0, 0]]),
      1: _rows(["tau=off", "tau=0.9"], [[1, 0, 0, 0], [0, 0, 0, 0]]),
    },
    "setdlm4": {
      0: _rows(set_s, [[1, 1, 1, 1], [1, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]),
      1: _rows(set_s, [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
    },
  }
  out = tb.summarize(per_seed, p)
  row = {(r["method"], r["setting"]): r for r in out["rows"]}
  assert row[("ar", "-")]["point"] == pytest.approx(5 / 8)
  assert row[("ar", "-")]["per_seed"] == [0.75, 0.5]
  assert row[("ar", "-")]["std"] == pytest.approx(np.std([0.75, 0.5], ddof=1))
  assert row[("setdlm4", "W=8 tau=off")]["lo"] == row[("setdlm4", "W=8 tau=off")]["hi"] == 0.0
  comps = {(c["b"], c["b_setting"]): c for c in out["comparisons"]}
  # AR has no tau: against SetDLM's W = S tau-off row; BD3LM at each tau against SetDLM's
  assert comps[("ar", "-")]["a_setting"] == "W=4 tau=off"
  assert comps[("bd3lm4", "tau=0.9")]["a_setting"] == "W=4 tau=0.9"
  assert comps[("bd3lm4", "tau=off")]["point"] == pytest.approx(7 / 8 - 2 / 8)
  ps = [c["p"] for c in out["comparisons"]]
  np.testing.assert_allclose([c["p_holm"] for c in out["comparisons"]], tb.stats.holm(ps))


def test_the_table_has_the_speed_axis_kept_tokens_per_call():
  """Accuracy tables carry each setting's kept tokens per forward call, the mean over seeds (the
  exact speed axis); a setting missing it on any seed shows '-'."""
  p = _plan(methods="ar,setdlm4", seeds="0,1", bootstrap=100)
  p["lr_grid"] = [2e-3]

  def rows(kept):
    out = _rows(["W=4 tau=off"], [[1, 0]])
    out[0]["kept_tokens_per_call"] = kept
    return out

  per_seed = {
    "ar": {0: rows(0.9), 1: rows(None)},
    "setdlm4": {0: rows(2.0), 1: rows(3.5)},
  }
  summary = tb.summarize(per_seed, p)
  kept = {r["method"]: r["kept_tokens_per_call"] for r in summary["rows"]}
  assert kept == {"ar": None, "setdlm4": 2.75}
  choice = {m: {"val": {"0.002": 0.5}, "chosen": 2e-3} for m in p["methods"]}
  text = tb.report_markdown({"plan": p, "lr_choice": choice, "summary": summary, "command": "x"})
  header = next(line for line in text.splitlines() if line.startswith("| method | setting"))
  assert header.endswith("| kept tokens / call |")
  assert "| 50.0 / 50.0 | 2.75 |" in text and "| 50.0 / 50.0 | - |" in text
  choice["ar"]["val"]["0.001"] = 0.25  # a rate one method tried: '-' for the others
  text = tb.report_markdown({"plan": p, "lr_choice": choice, "summary": summary, "command": "x"})
  assert "| ar | 25.0 | 50.0 | 0.002 |" in text and "| setdlm4 | - | 50.0 | 0.002 |" in text


def test_corpus_summary_is_a_ratio_of_sums():
  p = _plan(task="corpus", methods="ar,setdlm4", seeds="0,1", bootstrap=200)
  row = lambda v, c: [{"setting": "bound", "score": 0.0, "values": v, "counts": c}]  # noqa: E731
  per_seed = {
    "ar": {0: row([10.0, 20.0], [5, 5]), 1: row([12.0, 18.0], [5, 5])},
    "setdlm4": {0: row([20.0, 20.0], [5, 5]), 1: row([30.0, 10.0], [5, 5])},
  }
  out = tb.summarize(per_seed, p)
  assert out["rows"][0]["point"] == pytest.approx(60 / 20)
  assert out["comparisons"][0]["point"] == pytest.approx(80 / 20 - 60 / 20)


@pytest.mark.slow  # six tiny trainings and their decodes (~1-2 min on 2 cores)
def test_quick_run_chooses_on_validation_and_reruns_from_its_caches(tmp_path):
  argv = [
    "--task=arithmetic",
    "--quick",
    "--methods=bd3lm4,setdlm4",
    "--lr_grid=1e-3,2e-3",
    "--widen=0",  # the grid as given (widening: the tests above)
    "--seeds=0,1",
    f"--output_dir={tmp_path}",
  ]
  record = tb.main(argv, log=lambda *a: None)
  for m in ("bd3lm4", "setdlm4"):
    assert set(record["lr_choice"][m]["val"]) == {"0.001", "0.002"}
    assert record["lr_choice"][m]["chosen"] in (1e-3, 2e-3)
    for s in (0, 1):
      for r in record["outcomes"][m][s]:
        assert len(r["values"]) == 8  # the quick plan's test problems, one outcome each
  assert len(record["summary"]["comparisons"]) == 2  # bd3lm4 at tau off and 0.9
  saved = json.loads((tmp_path / "tuned_baselines.json").read_text())
  assert saved["markdown"] == (tmp_path / "tuned_baselines.md").read_text()
  assert "p (Holm)" in saved["markdown"]
  lines = []
  again = tb.main(argv, log=lines.append)  # every evaluation cached: nothing trained or decoded
  assert not any("trained in" in str(x) or "] val:" in str(x) for x in lines)
  assert again["summary"] == json.loads(json.dumps(record["summary"]))


def test_compare_methods_takes_a_learning_rate_per_method():
  assert tb.cm.parse_lrs("ar:1e-3, bd3lm4:5e-4") == {"ar": 1e-3, "bd3lm4": 5e-4}
  assert tb.cm.parse_lrs(None) == {}
  with pytest.raises(ValueError, match="METHOD:LR"):
    tb.cm.parse_lrs("ar=1e-3")
  args = tb.cm.parse_args(["--quick", "--lrs=setdlm4:3e-3"])
  p = tb.cm.plan(args)
  assert tb.cm.method_config("setdlm4", args, p).learning_rate == 3e-3
  assert tb.cm.method_config("ar", args, p).learning_rate != 3e-3
