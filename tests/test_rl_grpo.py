"""The GRPO loop (`setdiff_jax/rl/grpo.py`, launch/rl.py) from a tiny SFT workdir.

Bad input gets one `error:` line each (unknown reward lists the valid ones, G < 2, a commit policy
whose likelihood is not exact, nucleus / repetition penalty, no SFT checkpoint); one RL step runs
end to end through the launcher; a run stopped after step 1 (max_steps), then by a SIGTERM after
step 2, and resumed ends with parameters and metrics bitwise equal to the uninterrupted run's.
"""

import json
import os
import shutil
import signal
import sys

import jax
import numpy as np
import pytest

from configs import reasoning_common, rl_arithmetic
from setdiff_jax import errors, train
from setdiff_jax.data import pairs
from setdiff_jax.rl import config as rl_config
from setdiff_jax.rl import grpo, prompts, sft_start
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.workdir.metrics import MetricWriter
from test_reliability import assert_one_error_line, harness, launch

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def sft(tmp_path_factory, fast_compile):
  """A tiny conditional SetDLM (1 x 32, S = 4) trained 60 steps on the arithmetic task: some of
  its sampled completions end with a '#### n' line, so the format reward varies in a group."""
  del fast_compile
  c = reasoning_common.get_config("setdlm")
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.data.task_train_examples, c.data.task_eval_examples = 64, 8
  c.batch_size, c.num_train_steps, c.warmup_steps, c.learning_rate = 8, 60, 1, 1e-2
  c.eval_every_steps = c.checkpoint_every_steps = c.log_every_steps = 60
  c.num_eval_steps, c.eval_batch_size = 1, 8
  workdir = str(tmp_path_factory.mktemp("rl_sft"))
  train.train_and_evaluate(c, workdir)
  return workdir


def tiny_rl(init_from, **rl):
  c = rl_arithmetic.get_config()
  c.rl.init_from = init_from
  c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 2, 4, 12  # 8 rows: 8 devices
  c.rl.reward, c.rl.step_cost = "exact_match+format", 0.01
  c.rl.score_chunk = 7  # the scorer's head in chunks that do not divide the 32 positions
  c.num_train_steps, c.learning_rate, c.checkpoint_every_steps = 4, 1e-2, 2
  for k, v in rl.items():
    c.rl[k] = v
  return c


# ----------------------------------------------------------------------------- bad input
def test_bad_input_one_error_line_each(tmp_path):
  empty = tmp_path / "not_sft"
  empty.mkdir()
  base = ["--config=configs/rl_arithmetic.py", f"--workdir={tmp_path / 'rl'}"]
  some = f"--config.rl.init_from={empty}"
  cases = [
    ([some, "--config.rl.reward=exact"], ["rl.reward='exact'", "exact_match, format"]),
    ([some, "--config.rl.group_size=1"], ["rl.group_size=1", "[2, inf)"]),
    ([some, "--config.rl.policy=threshold"], ["rl.policy='threshold'", "not exact", "pmax"]),
    ([some, "--config.rl.top_p=0.9"], ["rl.top_p=0.9", "temperature only"]),
    ([some, "--config.rl.repetition_penalty=1.2"], ["rl.repetition_penalty=1.2"]),
    (
      [some, "--config.rl.policy_arg=-1"],
      ["--config.rl.policy_arg=-1.0 for --config.rl.policy=pmax", "must be > 0"],
    ),
    ([some], [f"rl.init_from={str(empty)!r} has no SFT checkpoint", "launch/train.py"]),
    ([], ["rl.init_from is empty"]),
  ]
  for (args, expected), result in zip(cases, harness("rl.py", [base + a for a, _ in cases])):
    assert_one_error_line(result, expected, args)
  assert not os.path.exists(tmp_path / "rl")  # nothing written for bad input


def test_config_fields_have_ranges():
  from setdiff_jax.config import run as run_config
  from setdiff_jax.config import sections

  c = rl_config.default_config()
  fields = {f"rl.{k}" for k in c.rl.keys()}
  assert fields == set(sections.RL.ranges()) | set(sections.RL.free_fields())
  assert set(sections.RL.free_fields()) == {
    "rl.init_from",
    "rl.reward",
    "rl.policy",
    "rl.policy_arg",
  }
  run_config.check_field_ranges(c)
  assert set(rl_config.OWN_FIELDS) == set(c.keys()) - {"rl"}  # each top-level field is used


def _config_only_run(tmp_path_factory, method: str) -> str:
  """An SFT workdir as far as the RL config checks read it (config.json: seq_len 32, S = 4;
  its tokenizer; a checkpoints/1 folder) without training: the checks come before parameters."""
  from setdiff_jax.config import run as run_config
  from setdiff_jax.workdir import checkpoints as checkpointing
  from setdiff_jax.workdir.tokenizer import build_tokenizer

  c = reasoning_common.get_config(method)
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.data.task_train_examples, c.data.task_eval_examples = 64, 8
  workdir = tmp_path_factory.mktemp(f"rl_sft_config_{method}")
  (workdir / "checkpoints" / "1").mkdir(parents=True)
  checkpointing.save_config(c, str(workdir))
  build_tokenizer(run_config.from_config_dict(c), str(workdir))
  return str(workdir)


@pytest.fixture(scope="module")
def config_only_sft(tmp_path_factory):
  return _config_only_run(tmp_path_factory, "setdlm")


def test_answers_without_a_final_answer_are_named_before_anything(tmp_path):
  """RL on an SFT run whose answers lack '#### n' failed at its first step with a bare line (with
  any reward: the accuracy metric reads them); the prompt pool now names file:line at once."""
  import types

  from setdiff_jax.data import pipeline

  f = tmp_path / "pairs.jsonl"
  f.write_text('{"prompt": "1+1", "answer": "#### 2"}\n{"prompt": "2+2", "answer": "4"}\n')
  data = pipeline.default_data_config()
  data.source, data.paths, data.preprocess = "pairs_jsonl", str(f), "pad"
  with pytest.raises(ValueError, match=f"^{f}:2: the reference answer .* RL reads '#### ANSWER'"):
    prompts.prompt_pool(types.SimpleNamespace(data=data), None)


def test_set_sampler_settings_on_an_ar_run_are_refused(tmp_path_factory):
  """rl.window, rl.policy, rl.policy_arg on an AR SFT run were accepted and dropped (kept tok/call
  1.00); they are refused before anything is read beyond config.json."""
  sft = _config_only_run(tmp_path_factory, "ar")
  for rl, names in (
    (dict(window=8), "rl.window"),
    (dict(policy="topk", policy_arg=3.0), "rl.policy and rl.policy_arg"),
  ):
    c = tiny_rl(sft, **rl)
    rl_config.validate(c)
    with pytest.raises(ValueError, match=f"invalid config: {names} would be ignored: this ar run"):
      rl_config.run_config_for(c, rl_config.load_sft_config(sft))
  c = tiny_rl(sft)
  assert rl_config.run_config_for(c, rl_config.load_sft_config(sft)).objective == "ar"


def _rl_setup(init_from, **rl):
  """grpo._setup's sampler config for an RL config (the checks that need N and the method)."""
  from setdiff_jax.config import run as run_config

  c = tiny_rl(init_from, **rl)
  rl_config.validate(c)
  run = rl_config.run_config_for(c, rl_config.load_sft_config(init_from))
  return grpo._setup(run_config.from_config_dict(run))[-1]


def test_window_longer_than_seq_len_one_error_line(config_only_sft, tmp_path):
  """rl.window W > the SFT run's seq_len is refused as launch/sample.py's --window is (one line,
  before anything is written); W = seq_len is accepted."""
  base = [
    "--config=configs/rl_arithmetic.py",
    f"--workdir={tmp_path / 'rl'}",
    f"--config.rl.init_from={config_only_sft}",
  ]
  cases = [
    (["--config.rl.window=64"], ["rl.window=64 must be in [1, seq_len=32]", "0 = its set size S"]),
    (["--config.rl.window=33"], ["rl.window=33 must be in [1, seq_len=32]"]),
  ]
  for (args, expected), result in zip(cases, harness("rl.py", [base + a for a, _ in cases])):
    assert_one_error_line(result, expected, args)
  assert not os.path.exists(tmp_path / "rl")  # nothing written for bad input
  assert _rl_setup(config_only_sft, window=32, max_new_tokens=0).window == 32


def test_step_budget_that_cannot_generate_n_tokens_one_error_line(config_only_sft, tmp_path):
  """The set sampler commits at most W tokens a step: rl.num_steps T with T * W < N would cut every
  rollout short (T=3, W=4, N=25: 12 tokens), so it is refused in one line naming T, W, N and the
  smallest T that works, ceil(N / W); every T with T * W >= N (and T = 0: N steps) is accepted."""
  n = _rl_setup(config_only_sft, max_new_tokens=0).max_new_tokens  # seq_len - the longest prompt
  need = -(-n // 4)  # W = S = 4 (rl.window=0)
  assert n == 25 and need == 7
  base = [
    "--config=configs/rl_arithmetic.py",
    f"--workdir={tmp_path / 'rl'}",
    f"--config.rl.init_from={config_only_sft}",
    "--config.rl.prompts_per_step=2",
    "--config.rl.group_size=4",
  ]
  cases = [
    (["--config.rl.num_steps=3"], ["rl.num_steps=3 with window W=4", "at most 12 of the N=25"]),
    ([f"--config.rl.num_steps={need - 1}"], [f"rl.num_steps={need - 1}", f">= {need}"]),
    (
      ["--config.rl.num_steps=2", "--config.rl.window=5", "--config.rl.max_new_tokens=12"],
      ["rl.num_steps=2 with window W=5:", "N=12 new tokens", "--config.rl.num_steps >= 3"],
    ),
  ]
  for (args, expected), result in zip(cases, harness("rl.py", [base + a for a, _ in cases])):
    assert_one_error_line(result, expected, args)
  assert not os.path.exists(tmp_path / "rl")  # refused before the workdir (and its lock) exists
  for rl in (
    dict(num_steps=need, max_new_tokens=0),  # 7 x 4 = 28 >= 25
    dict(num_steps=5, window=5, max_new_tokens=0),  # exactly N
    dict(num_steps=0, max_new_tokens=0),  # N steps
    dict(num_steps=3, window=4, max_new_tokens=12),
  ):
    _rl_setup(config_only_sft, **rl)
  for method in ("ar", "bd3lm"):  # AR ignores T; BD3LM runs min(T, G) steps per block
    rl_config.check_step_budget(method, 4, 1, 25)
  with pytest.raises(ValueError, match=r"rl.num_steps=1 with window W=4: .* >= 7 "):
    rl_config.check_step_budget("setdlm", 4, 1, 25)


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_one_rl_step_through_the_launcher(sft, tmp_path):
  from setdiff_jax.data import tokenizers

  workdir = str(tmp_path / "rl")
  # an earlier attempt from another SFT run left its tokenizer and no checkpoint: replaced
  tokenizers.save_in(tokenizers.train_tokenizer(["a b c d e f g"] * 20, 300), workdir)
  r = launch(
    "rl.py",
    [
      "--config=configs/rl_arithmetic.py",
      f"--workdir={workdir}",
      f"--config.rl.init_from={sft}",
      "--config.num_train_steps=1",
      "--config.rl.prompts_per_step=2",
      "--config.rl.group_size=4",
      "--config.rl.max_new_tokens=12",
      "--config.rl.reward=exact_match+format",
      "--config.rl.step_cost=0.01",
      "--config.rl.continuous_slots=4",  # rollouts continuously batched, scored exactly
    ],
  )
  assert r.returncode == 0, r.stderr[-3000:]
  last = r.stdout.strip().splitlines()[-1]
  assert last.startswith("done: RL step 1") and "checkpoints/1" in last, last
  [row] = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  for key in (
    "rl/reward_mean",
    "rl/reward_std",
    "rl/accuracy",
    "rl/kept_tokens_per_call",
    "rl/clip_fraction",
    "rl/rollout_tokens_per_sec",
    "rl/compiled_programs",
  ):
    assert key in row and np.isfinite(row[key]), key
  assert "rl/kl" not in row  # kl_beta = 0: no reference, no KL to report (never a false 0)
  assert row["step"] == 1 and row["rl/clip_fraction"] == 0.0  # mu = 1: pi = pi_old exactly
  assert row["rl/sampler_logprob_gap"] < 1e-4  # fp32: the scorer replays the sampler exactly
  assert 0.0 <= row["rl/accuracy"] <= 1.0 and row["rl/compiled_programs"] >= 3
  assert row["rl/zero_adv_fraction"] < 1.0 and row["rl/grad_norm"] > 0  # rewards vary (steps: EOS)
  saved = json.load(open(os.path.join(workdir, "config.json")))
  assert saved["rl"]["group_size"] == 4 and saved["objective"] == "setdlm"
  assert tokenizers.fingerprint(workdir) == tokenizers.fingerprint(sft)
  # the RL workdir reads like any run (launch/sample.py, launch/evaluate.py)
  state = workdir_lib.load_inference_state(workdir)
  before = workdir_lib.load_inference_state(sft)
  moved = [
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(
      jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(before.params)
    )
  ]
  assert state.step == 1 and max(moved) > 0


@pytest.mark.slow
def test_rows_must_split_over_the_mesh(sft, tmp_path):
  with pytest.raises(
    ValueError, match=r"= 6 rows must be divisible by the data x fsdp mesh size 8"
  ):
    grpo.train_rl(tiny_rl(sft, prompts_per_step=3, group_size=2), str(tmp_path / "rl"))
  assert not os.path.exists(tmp_path / "rl")


class TermAfterStep2(MetricWriter):
  """Sends this process a SIGTERM once step 2 is logged (what a scheduler's preemption does)."""

  def scalars(self, step, values):
    super().scalars(step, values)
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_resume_is_exact(sft, tmp_path, monkeypatch):
  """Also while the SFT run goes on training: the split run's SFT gains a newer checkpoint after
  its first call, and its resumes reload the step it started from (rl.init_step in config.json),
  as KL reference too (a probe found them reloading the newest step)."""
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  moving = str(tmp_path / "sft_moving")
  shutil.copytree(sft, moving, ignore=shutil.ignore_patterns(".lock"))
  a = grpo.train_rl(tiny_rl(sft, inner_updates=2, kl_beta=0.1), straight)
  first = grpo.train_rl(tiny_rl(moving, inner_updates=2, kl_beta=0.1), split, max_steps=1)
  assert first["step"] == 1 and first["checkpoint"] == 1  # max_steps: stop and save
  more = checkpointing.load_config(moving)
  more.num_train_steps, more.checkpoint_every_steps = 61, 1
  train.train_and_evaluate(more, moving)  # the SFT run saves step 61
  assert json.load(open(os.path.join(split, "config.json")))["rl"]["init_step"] == 60
  with monkeypatch.context() as m:
    m.setattr(grpo, "MetricWriter", TermAfterStep2)
    with pytest.raises(errors.StoppedBySignal, match="SIGTERM at RL step 2/4") as stop:
      grpo.train_rl(tiny_rl(moving, inner_updates=2, kl_beta=0.1), split)
  assert stop.value.exit_code == 143
  b = grpo.train_rl(tiny_rl(moving, inner_updates=2, kl_beta=0.1), split)  # a new call: restored
  assert a["step"] == b["step"] == 4
  pa = workdir_lib.load_inference_state(straight, use_ema=False).params
  reference = json.load(open(os.path.join(split, sft_start.REFERENCE_FILE)))  # the first start's
  step60 = workdir_lib.load_params_and_step(moving, like=pa, step=60)[0]
  assert reference["step"] == 60
  assert reference["params_fingerprint"] == sft_start.params_fingerprint(step60)

  def metrics(w):
    rows = [json.loads(l) for l in open(os.path.join(w, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if k not in grpo.TIMING_METRICS} for r in rows]

  assert metrics(straight) == metrics(split) and len(metrics(split)) == 4
  assert any(abs(r["rl/ratio_mean"] - 1.0) > 1e-6 for r in metrics(split))  # 2nd update moved
  pb = workdir_lib.load_inference_state(split, use_ema=False).params
  for x, y in zip(jax.tree_util.tree_leaves(pa), jax.tree_util.tree_leaves(pb)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  sft_params = workdir_lib.load_inference_state(sft).params
  assert any(
    np.any(np.asarray(x) != np.asarray(y))
    for x, y in zip(jax.tree_util.tree_leaves(pa), jax.tree_util.tree_leaves(sft_params))
  )
  # step 60 of the SFT run replaced by other parameters (its step 61's files): a further resume
  # would reload another model as its KL reference, and is refused before it trains
  steps = os.path.join(moving, "checkpoints")
  shutil.rmtree(os.path.join(steps, "60"))
  shutil.copytree(os.path.join(steps, "61"), os.path.join(steps, "60"))
  longer = tiny_rl(moving, inner_updates=2, kl_beta=0.1)
  longer.num_train_steps = 6
  saved = sorted(os.listdir(os.path.join(split, "checkpoints")))
  with pytest.raises(errors.CheckpointError, match="step 60 is not the checkpoint this RL run"):
    grpo.train_rl(longer, split)
  assert (
    len(metrics(split)) == 4 and sorted(os.listdir(os.path.join(split, "checkpoints"))) == saved
  )


def test_prompts_come_from_the_train_split(tok):
  c = reasoning_common.get_config("setdlm")
  c.data.task_train_examples, c.data.task_eval_examples = 400, 50
  pool, encoded = prompts.prompt_pool(c, tok)
  test = {p.prompt for p in pairs.load_pairs(c.data, "eval")}
  assert len(pool) == 400 and not {p.prompt for p in pool} & test
  assert encoded[0] == [tok.bos_id] + tok.encode(pool[0].prompt)  # the SFT context exactly


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ar", "bd3lm"])
def test_one_rl_step_of_the_other_scored_methods(objective, tmp_path):
  """AR (causal scorer) and BD3LM (block replay): one RL step from a 10-step SFT run; pi_old and
  pi come from the same scorer, so the first update's ratio is 1."""
  c = reasoning_common.get_config(objective)
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.data.task_train_examples, c.data.task_eval_examples = 64, 8
  c.batch_size, c.num_train_steps, c.warmup_steps, c.learning_rate = 8, 10, 1, 1e-2
  c.eval_every_steps = c.checkpoint_every_steps = c.log_every_steps = 10
  c.num_eval_steps, c.eval_batch_size = 1, 8
  sft_dir = str(tmp_path / "sft")
  train.train_and_evaluate(c, sft_dir)
  rl = tiny_rl(sft_dir)
  rl.num_train_steps = 1
  out = grpo.train_rl(rl, str(tmp_path / "rl"))
  assert out["step"] == 1 and out["checkpoint"] == 1
  assert abs(out["rl/ratio_mean"] - 1.0) < 1e-5 and out["rl/clip_fraction"] == 0.0
  assert np.isfinite(out["rl/loss"]) and out["rl/kept_tokens_per_call"] > 0
  assert out["rl/sampler_logprob_gap"] < 1e-4  # the scorer replays this sampler (fp32)


@pytest.mark.slow
def test_divergence_guard_stops_rl_keeping_the_healthy_checkpoint(sft, tmp_path, monkeypatch):
  """The trainer's guard in RL: rl/loss over the threshold from step 3 on (patience 2, a
  checkpoint every step, keep 1) stops at step 4 before saving; step 1 (the newest whose loss was
  seen healthy) is kept and loads, step 2 (saved before step 3's loss was seen) is set aside."""
  build = grpo._rl_step

  def inflated(*args, **kwargs):
    step = build(*args, **kwargs)

    def diverging(state, i):
      state, values = step(state, i)
      return state, dict(values, **{"rl/loss": 1e3 if i >= 2 else values["rl/loss"]})

    return diverging

  monkeypatch.setattr(grpo, "_rl_step", inflated)
  c = tiny_rl(sft)
  c.num_train_steps, c.checkpoint_every_steps, c.keep_checkpoints = 6, 1, 1
  c.divergence_patience = 2
  workdir = str(tmp_path / "rl")
  with pytest.raises(errors.DivergenceError, match=r"diverged at step 4: loss 1000 .*step 1"):
    grpo.train_rl(c, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2.diverged"]
  assert int(workdir_lib.load_inference_state(workdir, use_ema=False).step) == 1


@pytest.mark.slow
def test_two_processes_run_rl_like_one(sft, tmp_path):
  """launch/rl.py on 2 processes x 2 devices = 1 process x 4 devices (the local cluster, gloo):
  the same rollouts, rewards and updates (metrics <= 1e-5 relative), the same parameters."""
  from test_multihost import cluster

  args = [
    "launch/rl.py",
    "--config=configs/rl_arithmetic.py",
    f"--config.rl.init_from={sft}",
    "--config.rl.prompts_per_step=2",
    "--config.rl.group_size=4",
    "--config.rl.max_new_tokens=12",
    "--config.rl.reward=exact_match+format",
    "--config.rl.step_cost=0.01",
    "--config.num_train_steps=2",
    "--config.learning_rate=1e-2",
    "--config.checkpoint_every_steps=2",
  ]
  runs = {}
  for processes, devices in ((1, 4), (2, 2)):
    workdir = str(tmp_path / f"rl_{processes}")
    r, elapsed = cluster(
      [f"--num_processes={processes}", f"--devices_per_process={devices}", "--timeout=500"]
      + ["--", sys.executable]
      + args
      + [f"--workdir={workdir}"],
      timeout=600,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert r.stdout.count("done: RL step 2") == 1, r.stdout[-2000:]  # process 0 prints
    print(f"RL {processes} x {devices}: {elapsed:.1f}s")
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    runs[processes] = (rows, workdir)
  (one, w1), (two, w2) = runs[1], runs[2]
  assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
  for a, b in zip(one, two):
    for k, v in a.items():
      if k not in grpo.TIMING_METRICS:
        assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
  assert any(r["rl/reward_std"] > 0 for r in one)  # the groups' rewards differ: a real update
  pa = workdir_lib.load_inference_state(w1, use_ema=False).params
  pb = workdir_lib.load_inference_state(w2, use_ema=False).params
  for x, y in zip(jax.tree_util.tree_leaves(pa), jax.tree_util.tree_leaves(pb)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
