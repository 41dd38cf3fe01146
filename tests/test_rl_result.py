"""benchmarks/rl_result.py (issue 28's measured RL result): its pure helpers on hand-made inputs
(the control's compute matching, the learning-rate choice, plateau evidence, pairing by (seed,
problem), the target verdicts, path scrubbing) and, in the slow tier, the --quick run end to end
(tiny SetDLM, two RL steps) with its caches."""

import importlib.util
import json
import os

import ml_collections
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location(
    "rl_result", os.path.join(REPO, "benchmarks", "rl_result.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _sft_config():
  c = ml_collections.ConfigDict()
  c.objective = "setdlm"
  c.seed = 7
  c.batch_size = 32
  c.grad_accum_steps = 2
  c.num_train_steps = 2000
  c.learning_rate = 2e-3
  c.warmup_steps = 100
  c.lr_schedule = "cosine"
  c.cosine_alpha = 0.1
  c.weight_decay = 0.05
  c.adam_b1, c.adam_b2, c.adam_eps = 0.9, 0.98, 1e-9
  c.grad_clip_norm = 0.5
  c.eval_every_steps = 600
  c.checkpoint_every_steps = 600
  c.keep_checkpoints = 3
  c.log_every_steps = 50
  c.init_from = ""
  c.init_from_hf = ""
  c.model = ml_collections.ConfigDict({"hidden_size": 128, "num_layers": 2})
  return c


def test_control_config_matches_the_rl_compute(bench):
  p = dict(
    rl_steps=5,
    prompts_per_step=3,
    group_size=4,
    inner_updates=2,
    step_cost=0.02,
    cost_policy=["pmax", 0.7],
    cost_adv_eps=1.0,
  )
  rl = bench.rl_run_config("/x/sft", 1, 3e-5, p, False)
  sft = _sft_config()
  c = bench.control_config(sft, rl, 2e-4)
  # 5 RL steps x 2 updates of 3 x 4 rows -> 10 updates of 12 ground-truth rows
  assert (c.num_train_steps, c.batch_size, c.grad_accum_steps) == (10, 12, 1)
  assert (c.init_from, c.seed, c.learning_rate) == ("/x/sft", 1, 2e-4)
  # the RL run's optimiser chain (constant, no decay, clip 1, Adam 0.9/0.999/1e-8), not SFT's
  assert (c.lr_schedule, c.weight_decay, c.grad_clip_norm) == ("constant", 0.0, 1.0)
  assert (c.adam_b2, c.adam_eps, c.warmup_steps) == (0.999, 1e-8, 0)
  assert c.eval_every_steps == 10 and c.model.hidden_size == 128 and c.objective == "setdlm"
  assert sft.batch_size == 32 and sft.lr_schedule == "cosine"  # the SFT config is not touched
  # the RL arms: lambda = 0 with pmax tau off; lambda > 0 with the step cost and its policy
  assert (rl.rl.step_cost, rl.rl.policy, rl.rl.policy_arg) == (0.0, "pmax", None)
  assert (rl.rl.prompts_per_step, rl.rl.group_size, rl.rl.inner_updates) == (3, 4, 2)
  cost = bench.rl_run_config("/x/sft", 1, 3e-5, p, True)
  assert (cost.rl.step_cost, cost.rl.policy, cost.rl.policy_arg) == (0.02, "pmax", 0.7)
  assert (cost.rl.adv_eps, rl.rl.adv_eps) == (1.0, 1e-6)


def test_choose_lr_best_validation_accuracy_ties_to_the_smaller(bench):
  assert bench.choose_lr({1e-5: 0.40, 3e-5: 0.52, 1e-4: 0.47}) == 3e-5
  assert bench.choose_lr({1e-4: 0.5, 1e-5: 0.5, 3e-5: 0.1}) == 1e-5
  with pytest.raises(ValueError, match="no learning rate"):
    bench.choose_lr({})


def test_plateau_reads_eval_nll_and_train_loss_windows(bench):
  lines = [{"step": s, "train/loss": 1.0 / s} for s in range(50, 2001, 50)]
  lines += [{"step": 2000, "eval/nll": 0.25}, {"step": 600, "eval/nll": 0.5}]
  out = bench.plateau(lines, steps=(600, 1200, 2000, 3000))
  assert [x["step"] for x in out] == [600, 1200, 2000]  # 3000 was never reached
  assert out[0]["eval_nll"] == 0.5 and out[1]["eval_nll"] is None and out[2]["eval_nll"] == 0.25
  # (400, 600]: the losses logged at 450, 500, 550, 600
  assert out[0]["train_loss"] == pytest.approx(np.mean([1 / 450, 1 / 500, 1 / 550, 1 / 600]))


def _rec(arm, seed, correct, kept, calls, which=("off", "chosen")):
  per = {"correct": correct, "kept": kept, "calls": calls}
  return {"arm": arm, "seed": seed, **{f"test_{w}": {"per_example": per} for w in which}}


def test_pooled_pairs_by_seed_and_compare(bench):
  records = [
    _rec("rl", 1, [True, True], [4, 4], [2, 2]),
    _rec("rl", 0, [True, False], [6, 6], [3, 3]),
    _rec("control", 0, [False, False], [6, 6], [6, 6]),
    _rec("control", 1, [True, False], [4, 4], [4, 4]),
  ]
  a = bench.pooled(records, "rl", "off", [0, 1])
  assert a["correct"] == [True, False, True, True] and a["calls"] == [3, 3, 2, 2]
  c = bench.compare(records, "rl", "control", "off", [0, 1], n_boot=200)
  # accuracy 3/4 vs 1/4; kept/call 20/10 vs 20/20
  assert c["acc_diff"] == pytest.approx(0.5) and c["speedup"] == pytest.approx(2.0)
  assert c["n"] == 4 and c["acc_diff_ci"][0] <= 0.5 <= c["acc_diff_ci"][1]
  with pytest.raises(ValueError, match=r"no record for seeds \[2\]"):
    bench.pooled(records, "rl", "off", [0, 1, 2])
  records.append(_rec("sft", 0, [True], [1], [1]))
  records.append(_rec("sft", 1, [True], [1], [1]))
  with pytest.raises(ValueError, match="not evaluated on the same problems"):
    bench.compare(records, "rl", "sft", "off", [0, 1], n_boot=10)


def _comp(a, b, which, d, lo, x):
  return {"a": a, "b": b, "which": which, "acc_diff": d, "acc_diff_ci": [lo, d + 0.05]}, x


def test_target_verdicts(bench):
  comps = []
  for a, b, which, d, lo, x in (
    ("rl", "control", "off", 0.12, 0.02, 1.0),  # met: +12 points, CI above 0
    ("rl", "control", "chosen", 0.12, -0.01, 1.0),  # CI touches 0: not met
    ("rl_cost", "control", "chosen", -0.008, -0.03, 1.31),  # met: 1.31x, -0.8 points
    ("rl_cost", "control", "off", -0.02, -0.05, 1.5),  # 2 points lower: not met
  ):
    c, speed = _comp(a, b, which, d, lo, x)
    comps.append({**c, "speedup": speed, "speedup_ci": [speed - 0.1, speed + 0.1]})
  verdicts = [t["met"] for t in bench.targets(comps)]
  assert verdicts == [True, False, True, False]


def test_sft_steps_are_the_checkpoints_steps(bench):
  # the 5000-step record once said 2000: the flag's default, not the checkpoints RL started from
  recs = [{"arm": "sft", "step": 5000}, {"arm": "rl", "step": 250}, {"arm": "sft", "step": 5000}]
  assert bench.sft_steps(recs) == 5000
  assert bench.sft_steps(recs + [{"arm": "sft", "step": 2000}]) == [2000, 5000]


def test_scrub_replaces_the_longest_path_first(bench):
  names = {"/tmp/o": "OUT", "/tmp/o/seed0/runs/sft": "SFT0"}
  text = "a /tmp/o/seed0/runs/sft/x and /tmp/o/y"
  assert bench.scrub(text, names) == "a SFT0/x and OUT/y"


@pytest.mark.slow  # trains a tiny SFT, two RL runs and a control (~40-60 s on 2 cores)
def test_quick_run_writes_table_json_png_and_resumes_from_its_caches(bench, tmp_path):
  out = tmp_path / "rl"
  record = bench.main(["--quick", f"--output_dir={out}"], log=lambda *a: None)
  for ext in ("md", "json", "png"):
    path = out / f"rl_chain.{ext}"
    assert path.is_file() and path.stat().st_size > 0
    assert str(tmp_path) not in path.read_bytes().decode("latin-1")  # no machine paths
  md = (out / "rl_chain.md").read_text()
  assert "| rl - control | tau off |" in md and "continued SFT (control)" in md
  saved = json.loads((out / "rl_chain.json").read_text())
  arms = {r["arm"]: r for r in saved["records"]}
  assert sorted(arms) == ["control", "rl", "rl_cost", "sft"]
  for arm, r in arms.items():
    assert r["test_off"]["num_examples"] == 8 and r["splits"]["overlap"] == 0
    assert len(r["test_off"]["per_example"]["correct"]) == 8
    if arm != "sft":  # 2 RL steps x 1 update of 4 prompts x 2 completions
      assert (r["updates"], r["rows_per_update"]) == (2, 8) and r["train_seconds"] > 0
  control_metrics = out / arms["control"]["workdir"] / "metrics.jsonl"
  steps = [json.loads(x)["step"] for x in control_metrics.read_text().splitlines()]
  assert max(steps) == 2  # the control made exactly the RL run's number of updates
  rl_metrics = (out / arms["rl_cost"]["workdir"] / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(x)["step"] for x in rl_metrics] == [1, 2]
  assert len(saved["comparisons"]) == 10 and len(saved["targets"]) == 4
  assert saved["plan"]["sft_steps"] == 4  # the quick SFT's steps
  for r in arms["sft"]["val"]:  # each threshold setting is labelled with its own tau
    if r["policy"] == "threshold" and r["policy_arg"] is not None:
      assert r["setting"] == f"W=4 tau={r['policy_arg']:g}"
  # a rerun finds every arm in its cache: nothing is trained or decoded again
  lines = []
  again = bench.main(["--quick", f"--output_dir={out}"], log=lines.append)
  assert not any("train + evaluate" in str(x) or "candidate" in str(x) for x in lines)
  assert again["records"] == record["records"]
