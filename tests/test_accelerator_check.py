"""benchmarks/accelerator_check.py: the time bound (an overrunning section is cut, recorded as cut,
and the table is still written), the run plan, the model FLOPs behind MFU against XLA's count,
the peaks, the profile's op classes, and --tiny end to end (slow tier: every section on CPU at
tiny shapes); benchmarks/accelerator_run.sh never replaces a folder it did not make, nor an earlier
run's results. A driver killed mid-section, a second run into a folder and the official section's
backend: tests/test_accelerator_check_faults.py."""

import functools
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import accelerator_check, section_runner, step_flops
from benchmarks import training as tb
from setdiff_jax import models, objectives
from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion.losses import ObjectiveConfig
from setdiff_jax.models.dit import DiT, DiTConfig

SCRIPT = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), "benchmarks", "accelerator_run.sh"
)


def test_overrunning_section_is_cut_and_the_table_is_written(tmp_path, capsys):
  """The test-only `sleep` section writes one row, then sleeps for an hour: killed at its 3 s
  limit, it is recorded as cut with that row; the device section before it still reports, and
  results.jsonl, results.json and table.md are written. A later section past --budget_s is never
  started."""

  out = tmp_path / "out"
  results = accelerator_check.main(
    [
      "--tiny",
      "--sections=sleep",
      f"--output_dir={out}",
      "--timeouts=sleep=3,device=120",
    ]
  )
  printed = capsys.readouterr().out
  assert printed.startswith("plan (budget 1500 s, in priority order): device 120 s, sleep 3 s")
  assert "sleep: cut" in printed
  assert list(results) == ["device", "sleep"]
  assert results["device"]["status"] == "ok" and results["device"]["summary"]["device_count"] >= 1
  cut = results["sleep"]
  assert cut["status"] == "cut at its 3 s limit" and 3 <= cut["seconds"] < 60
  assert [r["slept"] for r in cut["rows"]] == [0]  # the row it finished before the cut
  table = (out / "table.md").read_text()
  assert "sleep: cut at its 3 s limit" in table and "device: " in table
  lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
  assert lines[0]["plan"][-1] == {
    "section": "sleep",
    "limit_s": 3.0,
    "start_s": 120.0,
    "in_budget": True,
  }
  assert [x for x in lines if x.get("table") == "sleep"] == [
    {"section": "sleep", "table": "sleep", "slept": 0, "pid": cut["rows"][0]["pid"]}
  ]
  assert any(x.get("status", "").startswith("cut") for x in lines)
  assert json.loads((out / "results.json").read_text())["sleep"]["status"].startswith("cut")

  spent = accelerator_check.main(
    ["--tiny", "--sections=sleep", f"--output_dir={tmp_path / 'b'}", "--budget_s=1"]
  )
  assert spent["sleep"]["status"].startswith("not started: --budget_s=1 spent")


def test_the_plan_starts_every_important_section_within_the_default_budget():
  """On an accelerator, the default limits of device, train, decode_dit, official, decode_qwen3
  and attention add up within the default 420 s budget in that priority order, so each starts
  whatever the ones before it take; levers, levers_xla and stack lie beyond it (started only on
  time the others leave) and the printed plan says so."""
  args = accelerator_check.parse_args(["--official=x"])
  assert args.budget_s == 420.0
  order = accelerator_check.section_order(",".join(accelerator_check.SECTIONS))
  steps = section_runner.plan(order, args.limits, args.budget_s)
  inside = [s["section"] for s in steps if s["in_budget"]]
  assert inside == ["device", "train", "decode_dit", "official", "decode_qwen3", "attention"]
  assert sum(args.limits[s] for s in inside) <= 420
  assert [s["section"] for s in steps if not s["in_budget"]] == ["levers", "levers_xla", "stack"]
  assert steps[1] == {"section": "train", "limit_s": 140, "start_s": 30, "in_budget": True}
  text = section_runner.plan_text(steps, args.budget_s, accelerator_check.MIN_START_S)
  assert text.startswith("plan (budget 420 s, in priority order): device 30 s, train 140 s")
  assert (
    "(420 s); beyond the budget" in text and "levers 150 s, levers_xla 60 s, stack 40 s" in text
  )


def dit_and_batch(name: str, layers=2, hidden=256, length=32, vocab=4096, batch=8):
  """A tiny DiT for method `name` (its adaLN variant, no dropout, the plain logits head), its
  parameter shapes and a batch of real tokens."""
  cfg = DiTConfig(
    vocab_size=vocab,
    hidden_size=hidden,
    num_layers=layers,
    num_heads=4,
    dropout=0.0,
    adaln=objectives.get(name).adaln,
    fused_head=False,
  )
  tokens = jnp.asarray(np.random.default_rng(0).integers(104, vocab, (batch, length)), jnp.int32)
  init = functools.partial(
    DiT(cfg).init,
    jax.random.key(0),
    tokens,
    jnp.zeros_like(tokens),
    jnp.ones((1, length, length), bool),
  )
  params = jax.eval_shape(init)["params"]
  return cfg, params, {"tokens": tokens, "attention_mask": jnp.ones_like(tokens)}


# What each method's training loss feeds the backbone, stated independently of step_flops: the
# slots S of its one call and the (query, key) pairs its attention mask allows, for rows of L.
GEOMETRY = {
  "setdlm": lambda n: (2 * n, masks.set_causal_mask(n).sum()),
  "ar": lambda n: (n - 1, n * (n - 1) // 2),
  "mdlm": lambda n: (n, n * n),
  "bd3lm": lambda n: (2 * n, masks.block_causal_mask(n, 4).sum()),
}


@pytest.mark.parametrize(
  "name",
  [
    "setdlm",
    "ar",
    pytest.param("mdlm", marks=pytest.mark.slow),
    pytest.param("bd3lm", marks=pytest.mark.slow),
  ],
)
def test_model_flops_against_xla(name):
  """The model FLOPs behind MFU against XLA's count of the compiled forward + backward of the
  method's loss (2 x 256 DiT, L = 32, V = 4096, batch 8). XLA's count = ours + the attention pairs
  the mask drops (a dense kernel computes them too: 12 layers D B (S^2 - pairs), exact) + the
  elementwise ops ours leaves out (norms, GELU, softmax, rotary, residuals, the loss): that rest
  is between 0 and 3 % of XLA's count (about 1 % here). The SetDLM head over all 2L slots (the
  old count) is 25 % over: 6 D V B L = 1.6 GFLOP of 6.7."""
  length, batch = 32, 8
  cfg, params, data = dit_and_batch(name, length=length, batch=batch)
  obj_cfg = ObjectiveConfig(name=name)
  objective, model = objectives.get(name), DiT(cfg)

  def loss(p):
    return objective.loss(obj_cfg, model, p, data, jax.random.key(1), train=True)[0]

  cost = jax.jit(jax.value_and_grad(loss)).lower(params).compile().cost_analysis()
  xla = (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]
  ours = step_flops.model_flops(params, cfg, obj_cfg, batch, length)
  slots, pairs = GEOMETRY[name](length)
  dropped = 12 * cfg.num_layers * cfg.hidden_size * batch * (slots * slots - pairs)
  rest = (xla - ours - dropped) / xla
  assert 0 <= rest <= 0.03, (name, xla, ours, dropped, rest)


def test_model_flops_at_the_lm1b_shapes():
  """The train row's count at the LM1B shapes, batch 256, by hand: the 12 x 12 D^2 block matmuls
  over 2L = 256 slots, the D x V head over the noisy L = 128, the set-causal pairs: 38.47 TFLOP
  per step (the old count, head over 2L: 43.08)."""
  d, v, layers, length, batch = 768, 30522, 12, 128, 256
  cfg = DiTConfig(vocab_size=v, hidden_size=d, num_layers=layers, num_heads=12)
  shapes = models.param_shapes(cfg)
  pairs = int(masks.set_causal_mask(length).sum())
  by_hand = (
    6 * layers * 12 * d * d * batch * 2 * length
    + 6 * d * v * batch * length
    + 12 * layers * d * batch * pairs
  )
  ours = step_flops.model_flops(shapes, cfg, ObjectiveConfig(name="setdlm"), batch, length)
  assert ours == pytest.approx(by_hand, rel=1e-12)
  assert round(ours / 1e12, 2) == 38.47


def test_train_rows_lower_no_flop_twin(monkeypatch):
  """A train row reads the model FLOPs (step_flops), never XLA's count of an unchunked twin of the
  step: training.benchmark must not lower that twin for it."""

  def twin(*a, **k):
    raise AssertionError("the unchunked twin was lowered")

  monkeypatch.setattr(tb, "model_flops", twin)
  args = accelerator_check.parse_args(["--tiny"])
  row, prep, _ = accelerator_check.train_row(args, "ar", 8)
  assert prep["flops"] is None and row["model_tflop_per_step"] > 0 and row["mfu"] is None


def test_profile_op_classes():
  from benchmarks.accelerator_check import name_class, op_class

  dit = "jit(step)/jvp(DiT)/blocks_3"
  assert name_class(f"{dit}/mlp_in/dot_general") == "matmuls"
  assert name_class("jit(step)/transpose(jvp(DiT))/blocks_0/attn_qkv/dot_general") == "matmuls"
  assert name_class(f"{dit}/bqhd,bkhd->bhqk/dot_general") == "attention"
  assert name_class(f"{dit}/jit(_where)/select_n") == "attention"
  assert name_class(f"{dit}/exp") == "attention"
  assert name_class(f"{dit}/norm1/reduce_sum") == "layer norms"
  assert name_class("jit(step)/jvp(DiT)/final_norm/mul") == "layer norms"
  assert name_class("jit(step)/jvp()/dot_general") == "head + loss"
  assert name_class("jit(step)/transpose(jvp())/reduce_sum") == "head + loss"
  assert name_class("jit(step)/jit(clip)/max") == "optimizer"
  assert name_class("jit(step)/mul") == "optimizer"
  assert (
    name_class("jit(step)/jvp()/jit(_threefry_split)/setdlm_loss/xor") == "RNG + order sampling"
  )
  assert name_class("jit(step)/jvp(jit(sample_order))/jit(argsort)/sort") == "RNG + order sampling"
  assert op_class(["fusion", "transpose", "copy", "parameter"], [f"{dit}/mlp_in/dot_general"]) == (
    "copies + casts"
  )
  names = [f"{dit}/mlp_in/dot_general", f"{dit}/mlp_in/add", "jit(step)/jvp()/exp"]
  assert op_class(["fusion", "dot", "add"], names) == "matmuls"  # the majority of its ops
  assert op_class(["fusion", "add"], []) == "elementwise + other"


def test_peak_is_the_chip_variants_own():
  """MFU divides by the chip's own peak: an H100 PCIe (756 TFLOP/s) or NVL (835) must not get the
  SXM part's 989, whatever order the table lists them in. device_kind strings as jax reports them."""
  from benchmarks.accelerator_check import peak_tflops

  assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
  assert peak_tflops("NVIDIA H100 PCIe") == 756.0
  assert peak_tflops("NVIDIA H100 NVL") == 835.0
  assert peak_tflops("NVIDIA H200") == 989.0
  assert peak_tflops("NVIDIA GH200 480GB") == 989.0
  assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
  assert peak_tflops("cpu") is None


def test_peak_matches_whole_names_the_longest_first():
  """ "NVIDIA L40" is no L4 (121 TFLOP/s) but an L40 (181); a TPU's device_kind gets its own
  chip's peak: v5e reports "TPU v5 lite" (197), v5p "TPU v5" (459), v6e "TPU v6 lite" (918)."""
  from benchmarks.accelerator_check import peak_tflops

  assert peak_tflops("NVIDIA L4") == 121.0
  assert peak_tflops("NVIDIA L40") == 181.0
  assert peak_tflops("NVIDIA L40S") == 362.0
  assert peak_tflops("TPU v5 lite") == 197.0
  assert peak_tflops("TPU v5") == 459.0
  assert peak_tflops("TPU v5p") == 459.0
  assert peak_tflops("TPU v6 lite") == 918.0


def test_bad_arguments_are_one_error_line(tmp_path):

  with pytest.raises(SystemExit, match="error: --sections='bogus'"):
    accelerator_check.main(["--tiny", "--sections=bogus", f"--output_dir={tmp_path / 'x'}"])
  with pytest.raises(SystemExit, match="error: --timeouts='train'"):
    accelerator_check.main(["--tiny", "--timeouts=train", f"--output_dir={tmp_path / 'x'}"])
  with pytest.raises(SystemExit, match="error: --timeouts='train=abc'"):
    accelerator_check.main(["--tiny", "--timeouts=train=abc", f"--output_dir={tmp_path / 'x'}"])
  (tmp_path / "file").write_text("")
  with pytest.raises(SystemExit, match="error: --output_dir=.*file is a file"):
    accelerator_check.main(["--tiny", f"--output_dir={tmp_path / 'file'}"])
  with pytest.raises(SystemExit, match="error: --output_dir=.*sub lies inside the file"):
    accelerator_check.main(["--tiny", f"--output_dir={tmp_path / 'file' / 'sub'}"])
  assert not (tmp_path / "x").exists()


def test_run_script_replaces_only_its_own_copy_of_the_official_tree(tmp_path):
  """OFFICIAL is replaced by a copy of .setdlms: the script refuses (one error line, exit 2,
  nothing touched) when OFFICIAL is .setdlms itself or any folder it did not make, and replaces
  its own copy on a rerun. PY=false: nothing after the copy is run for real."""
  repo = tmp_path / "repo"
  (repo / ".setdlms").mkdir(parents=True)
  (repo / ".setdlms" / "tree").write_text("official")
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "keep").write_text("mine")

  def run(official, out):
    env = dict(os.environ, OFFICIAL=str(official), PY="false", OUT=str(tmp_path / out))
    return subprocess.run(
      ["bash", SCRIPT, "run"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )

  for target in (repo / ".setdlms", mine):
    r = run(target, "out")
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "not a copy" in r.stderr
  assert (repo / ".setdlms" / "tree").read_text() == "official"
  assert (mine / "keep").read_text() == "mine"
  for out in ("out1", "out2"):  # a new folder, then the script's own copy
    r = run(tmp_path / "copy", out)
    assert r.returncode == 0 and "error:" not in r.stderr
    assert (tmp_path / "copy" / "tree").read_text() == "official"


def test_run_script_never_replaces_results_and_a_second_pass_has_its_own_folder(tmp_path):
  """The main pass writes into OUT; a second run into that OUT is refused (one error line, exit
  2, the first's files untouched); the documented second pass (SECTIONS=levers,levers_xla) writes
  into its own subfolder of OUT. PY is a stand-in that prints the check's arguments."""
  py = tmp_path / "py"
  py.write_text('#!/bin/bash\necho "check: $*"\n')
  py.chmod(0o755)
  repo, out = tmp_path / "repo", tmp_path / "out"
  repo.mkdir()

  base = {k: v for k, v in os.environ.items() if k not in ("SECTIONS", "BUDGET", "TINY")}

  def run(**env):
    env = dict(base, PY=str(py), OUT=str(out), OFFICIAL=str(tmp_path / "off"), **env)
    return subprocess.run(
      ["bash", SCRIPT, "run"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )

  first = run()
  assert first.returncode == 0, first.stderr
  assert f"--output_dir={out} --budget_s=420 " in first.stdout
  (out / "table.md").write_text("pass 1")
  again = run()
  assert again.returncode == 2 and again.stderr.count("error:") == 1 and str(out) in again.stderr
  second = run(SECTIONS="levers,levers_xla", BUDGET="240")
  assert second.returncode == 0, second.stderr
  sub = out / "sections_levers_levers_xla"
  assert f"--output_dir={sub} --budget_s=240 " in second.stdout
  assert "--sections=levers,levers_xla" in second.stdout
  assert (sub / "machine.txt").exists() and (out / "table.md").read_text() == "pass 1"


@pytest.mark.slow
def test_accelerator_check_tiny(tmp_path):
  """Every section on CPU at tiny shapes (the official one skipped without --official): each
  reports ok; the attention implementations agree with fp32 dense (fp32 rows to 1e-4, bf16 rows
  to bf16 rounding); the profile's classes cover the traced step; the decoding rows have their
  columns, bf16 decoding weights included."""

  out = tmp_path / "check"
  results = accelerator_check.main(["--tiny", f"--output_dir={out}", "--repeats=1"])
  assert list(results) == list(accelerator_check.SECTIONS)
  for name, res in results.items():
    want = {"official": "skipped: no --official", "levers_xla": "skipped: XLA:GPU"}.get(name, "ok")
    assert res["status"].startswith(want), (name, res["status"], res["summary"].get("traceback"))
  rows = {s: [r for r in results[s]["rows"]] for s in results}
  train = [r for r in rows["train"] if r["table"] == "train"]
  assert [r["objective"] for r in train] == ["setdlm", "setdlm", "ar"]
  assert all(r["tokens_per_s"] > 0 and r["loss"] > 0 for r in train)
  assert all(r["model_tflop_per_step"] > 0 for r in train)  # AR's too (step_flops)
  assert results["train"]["summary"]["init_s"] > 0
  profile = {r["op_class"]: r for r in rows["train"] if r["table"] == "profile"}
  assert set(accelerator_check.PROFILE_CLASSES) <= set(profile)
  assert profile["matmuls"]["ms_per_step"] > 0 and profile["attention"]["ms_per_step"] > 0
  assert profile["head + loss"]["ms_per_step"] > 0 and profile["optimizer"]["ms_per_step"] > 0
  assert abs(sum(profile[c]["share"] for c in accelerator_check.PROFILE_CLASSES) - 1) < 1e-6
  assert (out / "train_trace.json.gz").exists()
  ran = [r for r in rows["attention"] if "error" not in r]
  assert {(r["impl"], r["dtype"]) for r in ran} >= {
    (i, d) for i in ("dense", "xla", "blocksparse") for d in ("bfloat16", "float32")
  }
  assert [r["dtype"] for r in rows["attention"]][0] == "bfloat16"  # bf16 rows first
  for r in ran:  # every implementation computes fp32 dense attention's output and gradients
    tol = 1e-4 if r["dtype"] == "float32" else 5e-2
    assert r["max_abs_diff_out"] < tol and r["max_abs_diff_grad"] < tol, r
  dit = {(r["sampler"], r["weights"]): r for r in rows["decode_dit"]}
  assert set(dit) == {(s, w) for s in ("setdlm S=4", "ar") for w in ("float32", "bfloat16")}
  assert dit[("setdlm S=4", "float32")]["kept_tokens_per_call"] < 1.0  # 1 per step + prefill
  assert dit[("ar", "float32")]["floor_ms"] > 0 and "tokens_equal_fp32" in dit[("ar", "bfloat16")]
  assert dit[("ar", "bfloat16")]["weight_mib_per_call"] > 0
  qwen = {(r["sampler"], r["batch"]): r for r in rows["decode_qwen3"]}
  assert qwen[("ar", 1)]["kept_tokens_per_call"] <= 1.0
  assert qwen[("setdlm T=N/4", 1)]["kept_tokens_per_call"] > 2.0  # 4 per step, + the prefill
  assert rows["stack"][0]["fwd_bwd_ms"] > 0
  levers = {r["lever"]: r for r in rows["levers"]}
  assert list(levers) == ["reference"] + [name for name, *_ in accelerator_check.LEVERS]
  assert "error" in levers["cudnn attention"]  # refused on CPU, with its reason
  for name, _, factor, comparable in accelerator_check.LEVERS[1:]:
    r = levers[name]
    assert r["speedup"] > 0 and r["batch"] == 16 * factor, r
    if comparable:  # the same parameters, batches and keys: the same loss to bf16 rounding
      assert abs(r["loss_minus_base"]) < 5e-2 * levers["reference"]["loss"], r
    else:
      assert "loss_minus_base" not in r
  assert levers["head over the whole vocabulary"]["head_vocab_chunk"] == 0
  assert levers["logits head + loss"]["head_vocab_chunk"] is None
  table = (out / "table.md").read_text()
  assert "| op_class | ms_per_step | share |" in table and "decode_qwen3: ok" in table
