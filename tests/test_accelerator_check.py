"""benchmarks/accelerator_check.py: the time bound (an overrunning section is cut, recorded as cut,
and the table is still written), the profile's op classes, and --tiny end to end (slow tier: every
section on CPU at tiny shapes), and that benchmarks/accelerator_run.sh never replaces a folder it
did not make."""

import json
import os
import subprocess

import pytest

from benchmarks import accelerator_check


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
  assert list(results) == ["device", "sleep"]
  assert results["device"]["status"] == "ok" and results["device"]["summary"]["device_count"] >= 1
  cut = results["sleep"]
  assert cut["status"] == "cut at its 3 s limit" and 3 <= cut["seconds"] < 60
  assert [r["slept"] for r in cut["rows"]] == [0]  # the row it finished before the cut
  table = (out / "table.md").read_text()
  assert "sleep: cut at its 3 s limit" in table and "device: " in table
  lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
  assert {"section": "sleep", "table": "sleep", "slept": 0} in lines
  assert any(x.get("status", "").startswith("cut") for x in lines)
  assert json.loads((out / "results.json").read_text())["sleep"]["status"].startswith("cut")
  assert "sleep: cut" in capsys.readouterr().out

  spent = accelerator_check.main(
    ["--tiny", "--sections=sleep", f"--output_dir={tmp_path / 'b'}", "--budget_s=1"]
  )
  assert spent["sleep"]["status"].startswith("not started: --budget_s=1 spent")


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
  assert peak_tflops("TPU v5 lite") == 197.0
  assert peak_tflops("cpu") is None


def test_bad_arguments_are_one_error_line(tmp_path):

  with pytest.raises(SystemExit, match="error: --sections='bogus'"):
    accelerator_check.main(["--tiny", "--sections=bogus", f"--output_dir={tmp_path / 'x'}"])
  with pytest.raises(SystemExit, match="error: --timeouts='train'"):
    accelerator_check.main(["--tiny", "--timeouts=train", f"--output_dir={tmp_path / 'x'}"])


def test_run_script_replaces_only_its_own_copy_of_the_official_tree(tmp_path):
  """OFFICIAL is replaced by a copy of .setdlms: the script refuses (one error line, exit 2,
  nothing touched) when OFFICIAL is .setdlms itself or any folder it did not make, and replaces
  its own copy on a rerun. PY=false: nothing after the copy is run for real."""
  script = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "benchmarks", "accelerator_run.sh"
  )
  repo = tmp_path / "repo"
  (repo / ".setdlms").mkdir(parents=True)
  (repo / ".setdlms" / "tree").write_text("official")
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "keep").write_text("mine")

  def run(official):
    env = dict(os.environ, OFFICIAL=str(official), PY="false", OUT=str(tmp_path / "out"))
    return subprocess.run(
      ["bash", script, "run"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )

  for target in (repo / ".setdlms", mine):
    r = run(target)
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "not a copy" in r.stderr
  assert (repo / ".setdlms" / "tree").read_text() == "official"
  assert (mine / "keep").read_text() == "mine"
  for _ in range(2):  # a new folder, then the script's own copy
    r = run(tmp_path / "copy")
    assert r.returncode == 0 and "error:" not in r.stderr
    assert (tmp_path / "copy" / "tree").read_text() == "official"


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
