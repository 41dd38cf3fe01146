"""Bad and awkward input to the RL pieces (`setdiff_jax/rl/`), each one clear error or warning.

The prompt pool under the SFT run's `data.overflow` (skip / truncate_prompt / error) and the warning
when N cannot hold the answers; no `rl/kl` when no KL was computed; rl.num_steps on an AR run;
the scorer's static arguments and host token ids; rl.init_step checked before anything is
written (and a KL reference rotated out of the SFT run naming rl.init_step and the ways out);
group advantages, reward shapes and registered rewards returning None / NaN; `max_steps` < 1.
All of it without training: config-level SFT workdirs and tiny random models.
"""

import json
import logging
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import reasoning_common
from setdiff_jax import errors
from setdiff_jax.config import run as run_config
from setdiff_jax.data import pairs
from setdiff_jax.rl import config as rl_config
from setdiff_jax.rl import grpo, objective, prompts, rewards, scoring, sft_start
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir.tokenizer import build_tokenizer
from test_rl_grpo import _config_only_run, tiny_rl
from test_rl_scoring import M, hand_rollout, tiny

pytestmark = pytest.mark.usefixtures("fast_compile")


# ----------------------------------------------------------------------------- 1: prompt pool
def _pairs_file(path, long_operands: int) -> str:
  """200 short pairs 'a+b' -> 'a+b=c\\n#### c', then one long prompt '1+1+...+1' (line 201)."""
  rng = np.random.default_rng(0)
  rows = [
    {"prompt": f"{a}+{b}", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
    for a, b in rng.integers(1, 10, (200, 2)).tolist()
  ]
  rows.append({"prompt": "1+" * long_operands + "1", "answer": f"#### {long_operands + 1}"})
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _pairs_run(tmp_path, overflow: str, long_operands: int):
  """A config-level SetDLM SFT workdir (seq_len 32, its tokenizer, a checkpoints/1 folder) on
  the pairs file, trained with data.overflow=`overflow`."""
  tmp_path.mkdir(parents=True, exist_ok=True)
  c = reasoning_common.get_config("setdlm")
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.data.source = "pairs_jsonl"
  c.data.paths = _pairs_file(tmp_path / "pairs.jsonl", long_operands)
  c.data.overflow = overflow
  sft = tmp_path / "sft"
  (sft / "checkpoints" / "1").mkdir(parents=True)
  checkpointing.save_config(c, str(sft))
  tok = build_tokenizer(run_config.from_config_dict(c), str(sft))
  return str(sft), c, tok


def _setup(sft, **rl):
  c = tiny_rl(sft, **rl)
  rl_config.validate(c)
  run = rl_config.run_config_for(c, rl_config.load_sft_config(sft))
  return grpo._setup(run_config.from_config_dict(run))


def test_prompt_pool_reads_the_pairs_as_the_sft_run_did(tmp_path):
  """`skip` leaves the long pair out (its prompt never trained), `truncate_prompt` keeps its last
  tokens after BOS, as `pairs.encode_pairs` made the SFT rows; prompts stay with their pairs."""
  sft, c, tok = _pairs_run(tmp_path, "skip", 40)
  every = pairs.load_pairs(c.data, "train")
  for rule in ("skip", "truncate_prompt"):
    c.data.overflow = rule
    pool, encoded = prompts.prompt_pool(c, tok)
    rows, _ = pairs.encode_pairs(tok, every, c.seq_len, overflow=rule)
    assert encoded == [p for p, _ in rows]
    assert len(pool) == len(encoded) == (200 if rule == "skip" else 201)
    for pair, p in zip(pool, encoded):  # the reference answers stay with their prompts
      want = [tok.bos_id] + tok.encode(pair.prompt)
      assert p == want or (rule == "truncate_prompt" and p == want[:1] + want[-(len(p) - 1) :])
    assert max(len(p) for p in encoded) <= c.seq_len - 2  # room for an answer and its EOS


def test_rl_starts_on_skip_and_truncate_prompt_runs(tmp_path):
  """RL refused both with an empty N range ('N must be in [1, -50]'): the long prompt the SFT run
  skipped set N. Now N = seq_len - the longest kept prompt."""
  sft, _, _ = _pairs_run(tmp_path / "skip", "skip", 40)
  out = _setup(sft, max_new_tokens=0)
  assert out[-1].max_new_tokens == 32 - max(len(p) for p in out[5]) == 28
  sft, _, _ = _pairs_run(tmp_path / "truncate", "truncate_prompt", 20)
  assert _setup(sft, max_new_tokens=0)[-1].max_new_tokens >= 1


def test_answers_n_cannot_hold_are_one_warning_line(tmp_path, caplog):
  """One long prompt (data.overflow=error, it fits) sets N for every row: N = 6 cannot hold the
  other 200 answers (11 tokens with EOS); the run starts with one warning naming how many."""
  sft, _, _ = _pairs_run(tmp_path, "error", 12)
  with caplog.at_level(logging.WARNING):
    sampler_cfg = _setup(sft, max_new_tokens=0)[-1]
  lines = [r.getMessage() for r in caplog.records if "rl.max_new_tokens" in r.getMessage()]
  assert len(lines) == 1, lines
  n = sampler_cfg.max_new_tokens
  assert f"N={n} new tokens cannot hold the reference answer (+EOS) of 200 of the 201" in lines[0]
  assert "the longest train prompt" in lines[0]
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    _setup(sft, max_new_tokens=3)  # an explicit N below the most that fits: says how far to go
  [line] = [r.getMessage() for r in caplog.records if "rl.max_new_tokens" in r.getMessage()]
  assert "of 200 of the 201" in line and f"raise --config.rl.max_new_tokens (at most {n}" in line


# ----------------------------------------------------------------------------- 2: rl/kl
def test_kl_is_left_out_when_it_was_not_computed():
  """kl_beta = 0 loads no reference, so no KL is measured: `rl/kl` was logged as 0.0 ("no drift")
  while the policy moved; now the key is absent (and present with a reference)."""
  logp, mask = jnp.zeros((2, 3)), jnp.ones((2, 3), bool)
  _, m = objective.grpo_loss(logp, logp - 0.5, jnp.asarray([1.0, -1.0]), mask, clip_eps=0.2)
  assert "kl" not in m and {"policy_loss", "clip_fraction", "ratio_mean"} <= set(m)
  kl = jnp.full((2, 3), 0.25)
  _, m = objective.grpo_loss(logp, logp, jnp.zeros(2), mask, clip_eps=0.2, beta=0.1, kl=kl)
  assert float(m["kl"]) == pytest.approx(0.25)


def test_rl_update_without_a_reference_reports_no_kl():
  """The RL update (`grpo.make_functions`) at kl_beta = 0: its metrics, the rl/* values of every
  step, have no kl."""
  import optax

  from setdiff_jax.sampling import SamplerConfig

  model, params = tiny(16)
  rollout = hand_rollout("setdlm", np.random.default_rng(0), b=2, length=8)
  run = SimpleNamespace(rl=SimpleNamespace(kl_beta=0.0, clip_eps=0.2, score_chunk=3))
  cfg = SamplerConfig(
    mask_token_id=M, eos_token_id=0, pad_token_id=0, bos_token_id=0, temperature=0.7, greedy=False
  )
  tx = optax.sgd(0.1)
  score, _, update = grpo.make_functions(run, "setdlm", model, tx, cfg)
  old = score(params, rollout)
  _, _, m = jax.jit(update)(
    params, tx.init(params), rollout, jnp.asarray([1.0, -1.0]), old, None, None
  )
  assert "kl" not in m and np.isfinite(float(m["loss"]))


# ----------------------------------------------------------------------------- 3: AR num_steps
def test_num_steps_on_an_ar_run_is_refused(tmp_path_factory):
  """rl.num_steps on an AR SFT run was accepted, recorded in config.json and ignored (AR decodes
  one token a step); it is refused as rl.window is. SetDLM reads it."""
  sft = _config_only_run(tmp_path_factory, "ar")
  c = tiny_rl(sft, num_steps=2)
  rl_config.validate(c)
  with pytest.raises(
    ValueError, match="invalid config: rl.num_steps would be ignored: this ar run"
  ):
    rl_config.run_config_for(c, rl_config.load_sft_config(sft))
  set_sft = _config_only_run(tmp_path_factory, "setdlm")
  run = rl_config.run_config_for(tiny_rl(set_sft, num_steps=3), rl_config.load_sft_config(set_sft))
  assert run.rl.num_steps == 3


# ----------------------------------------------------------------------------- 4: scorer arguments
@pytest.mark.parametrize(
  "kw, expect",
  [
    (dict(temperature=0.0), r"temperature=0.0 must be a finite number >= 0.0001"),
    (dict(temperature=-1.0), r"temperature=-1.0 must be a finite number"),
    (dict(temperature=float("nan")), r"temperature=nan must be"),
    (dict(mask_token_id=99), r"mask_token_id=99 must be in \[0, V=16\)"),
    (dict(mask_token_id=-1), r"mask_token_id=-1 must be in \[0, V=16\)"),
    (dict(chunk=-3), r"chunk=-3 must be an int >= 0"),
    (dict(tokens=40), r"rollout.tokens holds ids outside \[0, V=16\): 40 at row 0"),
    (dict(tokens=-2), r"rollout.tokens holds ids outside \[0, V=16\): -2 at row 0"),
  ],
)
def test_scorer_bad_arguments_are_one_value_error(kw, expect):
  """They gave NaN (temperature 0, ids >= V, M >= V), garbage (a negative temperature, ids < 0
  wrapping around) or a reshape TypeError (chunk < 0)."""
  model, params = tiny(16)
  r = hand_rollout("setdlm", np.random.default_rng(0), b=2, length=8)
  if "tokens" in kw:
    r = r._replace(tokens=np.where(r.generated, kw.pop("tokens"), r.tokens).astype(np.int32))
  args = dict(dict(temperature=0.7, mask_token_id=M), **kw)
  with pytest.raises(ValueError, match=expect):
    scoring.token_logprobs("setdlm", model, params, r, **args)
  if "chunk" not in kw:  # token_logits takes no chunk
    with pytest.raises(ValueError, match=expect):
      scoring.token_logits("setdlm", model, params, r, **args)


def test_scorer_checks_under_jit_and_on_given_features():
  """The static checks hold under jit too (a traced rollout's ids are not read there); head_scores
  on a logits function's features (F = V) checks V from them."""
  model, params = tiny(16)
  r = hand_rollout("setdlm", np.random.default_rng(0), b=2, length=8)
  fn = jax.jit(
    scoring.token_logprobs, static_argnums=(0, 1), static_argnames=("temperature", "mask_token_id")
  )
  with pytest.raises(ValueError, match=r"mask_token_id=16 must be in \[0, V=16\)"):
    fn("setdlm", model, params, r, temperature=0.7, mask_token_id=16)
  lp = fn("setdlm", model, params, r, temperature=0.7, mask_token_id=M)
  assert np.all(np.isfinite(np.asarray(lp)))
  z = jnp.zeros((2, 8, 9))
  logits_fn = lambda *a: None  # noqa: E731 - never run: its head is the identity
  good = r._replace(tokens=np.minimum(r.tokens, 8))
  scoring.head_scores(logits_fn, None, z, good, temperature=0.7, mask_token_id=M)
  with pytest.raises(ValueError, match=r"holds ids outside \[0, V=9\)"):
    scoring.head_scores(logits_fn, None, z, r, temperature=0.7, mask_token_id=M)
  with pytest.raises(ValueError, match=r"chunk=2.5 must be an int >= 0"):
    scoring.head_scores(logits_fn, None, z, good, temperature=0.7, mask_token_id=M, chunk=2.5)


# ----------------------------------------------------------------------------- 5: rl.init_step
@pytest.fixture(scope="module")
def config_only_sft(tmp_path_factory):
  return _config_only_run(tmp_path_factory, "setdlm")


def test_bad_init_step_is_refused_before_anything_is_written(config_only_sft, tmp_path):
  """It named a `--step` flag RL does not have, after creating the RL workdir (.lock,
  checkpoints)."""
  workdir = tmp_path / "rl"
  with pytest.raises(ValueError) as e:
    grpo.train_rl(tiny_rl(config_only_sft, init_step=999), str(workdir))
  msg = str(e.value)
  assert msg.startswith("invalid config: rl.init_step=999: the SFT run rl.init_from=")
  assert "no checkpoint at step 999 (its steps: [1])" in msg and "--step" not in msg
  assert not workdir.exists()


def _rotated(tmp_path_factory, sft):
  """An RL workdir that started from SFT step 60 (config.json, a checkpoints/1 folder) of a copy
  of `sft` that now holds steps 63 and 64 only (its keep_checkpoints rotated 60 out)."""
  import shutil

  moved = str(tmp_path_factory.mktemp("sft_moved"))
  shutil.copytree(sft, moved, dirs_exist_ok=True)
  shutil.rmtree(os.path.join(moved, "checkpoints", "1"))
  for s in ("63", "64"):
    os.makedirs(os.path.join(moved, "checkpoints", s))
  c = tiny_rl(moved, kl_beta=0.1)
  run = rl_config.run_config_for(c, rl_config.load_sft_config(moved))
  run.rl.init_step = 60
  workdir = tmp_path_factory.mktemp("rl_resume")
  (workdir / "checkpoints" / "1").mkdir(parents=True)
  checkpointing.save_config(run, str(workdir))
  return moved, str(workdir), run


def test_resume_without_the_kl_reference_names_rl_init_step_and_the_ways_out(
  config_only_sft, tmp_path_factory
):
  """README promised the reference reloads while the SFT run saves newer steps; once its
  keep_checkpoints rotated the step out the resume said 'no checkpoint at --step=60'. Now: one
  error naming rl.init_step, that the SFT run no longer holds it, and the ways out, before the
  lock is taken; a resume with kl_beta = 0 reads no SFT step and is not refused by it."""
  moved, workdir, run = _rotated(tmp_path_factory, config_only_sft)
  with pytest.raises(errors.CheckpointError) as e:
    grpo.train_rl(tiny_rl(moved, kl_beta=0.1), workdir)
  msg = str(e.value)
  for part in (
    "rl.init_step=60",
    "KL reference (rl.kl_beta=0.1)",
    "the SFT run no longer holds that step (its steps now: [63, 64]",
    "keep_checkpoints",
    "copy that step's folder back",
    "start a new RL run",
  ):
    assert part in msg, (part, msg)
  assert "--step" not in msg and "\n" not in msg
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json"]  # no lock taken
  # the same error when the step goes between that check and the load (the SFT run saving on)
  with pytest.raises(errors.CheckpointError, match=r"^rl.init_step=60: this RL run started from"):
    sft_start.load_sft(run.rl, {"w": jnp.zeros(2)}, 60, resume=True)
  run.rl.kl_beta = 0.0
  sft_start.check_init_step(run.rl, workdir, 60)  # nothing to reload: not refused
  run.rl.kl_beta = 0.1
  sft_start.check_init_step(run.rl, workdir, 61)  # a changed init_step: the resume check names it


def _numpy_leaf_sums(x: np.ndarray) -> np.ndarray:
  """sft_start._leaf_sums recomputed in numpy (uint32 arithmetic wraps as in XLA), serially."""
  words = x.view(f"uint{8 * x.dtype.itemsize}").astype(np.uint32).reshape(-1)

  def mix(v):
    v = v * np.uint32(0x85EBCA6B)
    v = v ^ (v >> np.uint32(13))
    v = v * np.uint32(0xC2B2AE35)
    return v ^ (v >> np.uint32(16))

  index = np.arange(words.size, dtype=np.uint32)
  a = mix(words ^ mix(index + np.uint32(0x9E3779B9)))
  b = mix(a + index * np.uint32(0x27D4EB2F))
  total = lambda v: np.uint32(int(v.astype(np.uint64).sum()) % (1 << 32))
  return np.array([total(a), total(b)], np.uint32)


def test_params_fingerprint_is_exact_and_the_same_on_any_mesh():
  """The KL reference's fingerprint: the leaf sums equal a serial numpy recomputation; the same
  parameters sharded over 8 devices give the same fingerprint; one ulp, two elements swapped, a
  dtype or a leaf name changed each give another."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  rng = np.random.default_rng(0)
  tree = {
    "dense": {"kernel": rng.standard_normal((16, 24)).astype(np.float32)},
    "norm": rng.standard_normal(8).astype(jnp.bfloat16),
    "count": np.arange(5, dtype=np.int32),
  }
  sums = jax.device_get(sft_start._tree_sums(jax.tree_util.tree_map(jnp.asarray, tree)))
  for leaf, got in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(sums)):
    np.testing.assert_array_equal(got, _numpy_leaf_sums(np.asarray(leaf)))
  reference = sft_start.params_fingerprint(tree)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "fsdp"))
  sharded = dict(
    tree,
    dense={
      "kernel": jax.device_put(
        tree["dense"]["kernel"], NamedSharding(mesh, PartitionSpec("data", "fsdp"))
      )
    },
  )
  assert sft_start.params_fingerprint(sharded) == reference
  kernel = tree["dense"]["kernel"]
  one_ulp = kernel.copy()
  one_ulp[3, 4] = np.nextafter(one_ulp[3, 4], np.float32(np.inf))
  swapped = kernel.copy()
  swapped[[0, 1]] = swapped[[1, 0]]
  others = [
    dict(tree, dense={"kernel": one_ulp}),
    dict(tree, dense={"kernel": swapped}),
    dict(tree, dense={"kernel": kernel.astype(jnp.bfloat16)}),
    {"dense": {"bias": kernel}, "norm": tree["norm"], "count": tree["count"]},
  ]
  prints = {sft_start.params_fingerprint(t) for t in others}
  assert len(prints) == len(others) and reference not in prints


def test_a_resume_refuses_a_kl_reference_changed_since_the_first_start(tmp_path):
  """Probe round 15: an SFT run trained again at the same path became the KL reference of an RL
  resume without a word; the first fix compared the step's checksums.json, which object-store
  steps do not have (a retrained gs:// SFT run still slipped through). The first start records
  the loaded parameters' fingerprint (sft_reference.json); the reloaded reference must match it,
  wherever the SFT run lives. A record without one (an older run) is not compared."""
  workdir = str(tmp_path)
  run = tiny_rl("gs://bucket/sft", kl_beta=0.1)
  first = {"w": jnp.arange(6, dtype=jnp.float32)}
  retrained = {"w": jnp.arange(6, dtype=jnp.float32) * 1.001}
  sft_start.record_reference(workdir, "gs://bucket/sft", 60, sft_start.params_fingerprint(first))
  record = json.load(open(os.path.join(workdir, sft_start.REFERENCE_FILE)))
  assert record["step"] == 60 and len(record["params_fingerprint"]) == 64
  sft_start.check_same_reference(run.rl, workdir, 60, first)  # the same parameters: resumes
  with pytest.raises(errors.CheckpointError) as e:
    sft_start.check_same_reference(run.rl, workdir, 60, retrained)
  msg = str(e.value)
  assert msg.startswith("rl.init_from='gs://bucket/sft' step 60 is not the checkpoint this RL run")
  assert "its parameters differ" in msg and "Restore that SFT run from a backup" in msg
  assert "\n" not in msg
  with open(os.path.join(workdir, sft_start.REFERENCE_FILE), "w") as f:
    json.dump({"init_from": "gs://bucket/sft", "step": 60, "checksums_sha256": "ab"}, f)
  sft_start.check_same_reference(run.rl, workdir, 60, retrained)  # recorded none: not compared
  with open(os.path.join(workdir, sft_start.REFERENCE_FILE), "w") as f:
    f.write('{"step": 6')
  with pytest.raises(errors.CheckpointError, match="sft_reference.json is damaged"):
    sft_start.check_same_reference(run.rl, workdir, 60, first)


def test_a_resume_refuses_an_sft_tokenizer_changed_since_the_first_start(config_only_sft, tmp_path):
  """Probe round 16: the ids of '1' and '2' swapped in the SFT run's tokenizer.json between the
  first start and a resume; the resume built the rollouts' tokenizer from the SFT run without a
  check (accuracy 0.64 -> 0.19), while the RL workdir's own copy kept the old ids. Refused now,
  before the lock, with kl_beta = 0 too (nothing else of the SFT run is reloaded then)."""
  import shutil

  sft = str(tmp_path / "sft")
  shutil.copytree(config_only_sft, sft)
  c = tiny_rl(sft, kl_beta=0.0)
  run = rl_config.run_config_for(c, rl_config.load_sft_config(sft))
  run.rl.init_step = 1
  workdir = tmp_path / "rl"
  (workdir / "checkpoints" / "1").mkdir(parents=True)
  checkpointing.save_config(run, str(workdir))
  shutil.copytree(os.path.join(sft, "tokenizer"), workdir / "tokenizer")  # the first start's copy
  tokenizer = build_tokenizer(run, sft, allow_training=False, save=False)
  sft_start.check_same_tokenizer(run.rl, tokenizer, str(workdir))  # the same ids: resumes
  path = os.path.join(sft, "tokenizer", "tokenizer.json")
  spec = json.load(open(path))
  vocab = spec["model"]["vocab"]
  vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
  json.dump(spec, open(path, "w"))
  with pytest.raises(errors.CheckpointError) as e:
    grpo.train_rl(c, str(workdir))
  msg = str(e.value)
  assert msg.startswith(f"rl.init_from={sft!r}: its tokenizer/ is not the one this RL run started")
  assert "2 of this run's" in msg and "start a new RL run" in msg and "\n" not in msg
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "tokenizer"]  # no lock


def test_a_resume_names_an_sft_config_changed_since_the_first_start(config_only_sft, tmp_path):
  """Probe round 16: the SFT run's config.json edited (data.task_max_operand 9 -> 5) after the
  first start; the resume was refused, but told the user to 'drop these overrides' they never
  gave. The refusal names the SFT run's config.json; this run's own fields are not its concern."""
  import shutil

  sft = str(tmp_path / "sft")
  shutil.copytree(config_only_sft, sft)
  c = tiny_rl(sft)
  run = rl_config.run_config_for(c, rl_config.load_sft_config(sft))
  run.rl.init_step = 1
  workdir = tmp_path / "rl"
  (workdir / "checkpoints" / "1").mkdir(parents=True)
  checkpointing.save_config(run, str(workdir))
  longer = tiny_rl(sft)
  longer.num_train_steps += 4  # this run's own field: the resume check's concern
  sft_start.check_same_sft_config(
    rl_config.run_config_for(longer, rl_config.load_sft_config(sft)), str(workdir)
  )
  path = os.path.join(sft, "config.json")
  saved = json.load(open(path))
  saved["data"]["task_max_operand"] = 5
  json.dump(saved, open(path, "w"))
  with pytest.raises(errors.ConfigMismatchError) as e:
    grpo.train_rl(c, str(workdir))
  msg = str(e.value)
  assert msg.startswith(f"rl.init_from={sft!r}: its config.json differs from the one this RL run")
  assert "data.task_max_operand: 9 -> 5" in msg and "overrides" not in msg and "\n" not in msg
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json"]  # no lock taken


def test_a_resume_reads_the_sft_config_not_its_checkpoints(config_only_sft, tmp_path):
  """Probe round 15: with kl_beta = 0 a resume reads no SFT parameters, yet an SFT run whose
  checkpoints were deleted stopped it with "train one first" (which leads to another model). A
  resume now needs the SFT run's config.json (and tokenizer/) only; a folder gone says restore."""
  import shutil

  sft = str(tmp_path / "sft")
  shutil.copytree(config_only_sft, sft)
  shutil.rmtree(os.path.join(sft, "checkpoints"))
  with pytest.raises(FileNotFoundError, match="has no SFT checkpoint"):
    rl_config.load_sft_config(sft)  # a new run starts from its parameters
  assert rl_config.load_sft_config(sft, resume=True).objective == "setdlm"
  shutil.rmtree(sft)
  with pytest.raises(FileNotFoundError) as e:
    rl_config.load_sft_config(sft, resume=True)
  assert str(e.value).startswith(f"rl.init_from={sft!r} is gone (no config.json there)")
  assert "Restore that folder from a backup" in str(e.value) and "train one" not in str(e.value)


# ----------------------------------------------------------------------------- 7: advantages
def test_group_advantages_bad_input():
  r = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
  with pytest.raises(ValueError, match="group_size=0 must be >= 1"):
    objective.group_advantages(r, 0)  # was ZeroDivisionError
  with pytest.raises(ValueError, match="group_size=-1 must be >= 1"):
    objective.group_advantages(r, -1)  # was a reshape TypeError
  with pytest.raises(ValueError, match="group_size=2.0 must be an int"):
    objective.group_advantages(r, 2.0)
  with pytest.raises(ValueError, match=r"reward nan at row 1 is not finite \(1 such rows\)"):
    objective.group_advantages(np.array([1.0, np.nan, 0.0, 1.0]), 2)  # was NaN advantages
  with pytest.raises(ValueError, match=r"reward inf at row 3"):
    objective.group_advantages(np.array([1.0, 0.0, 0.0, np.inf]), 2)
  with pytest.raises(ValueError, match=r"rewards has shape \[2, 2\]: one reward per row"):
    objective.group_advantages(r.reshape(2, 2), 2)
  traced = jax.jit(lambda x: objective.group_advantages(x, 2))(jnp.asarray(r))  # not read
  np.testing.assert_allclose(np.asarray(traced), np.asarray(objective.group_advantages(r, 2)))


def test_reward_steps_must_be_one_per_row():
  texts, refs = ["#### 1", "#### 2"], ["#### 1", "#### 1"]
  with pytest.raises(ValueError, match=r"steps has shape \[2, 2\]: one decoding step count"):
    rewards.compute("exact_match", texts, refs, [[1, 2], [3, 4]])  # was a 2 x 2 reward array
  with pytest.raises(ValueError, match="2 completions, 2 references and 3 step counts"):
    rewards.compute("exact_match", texts, refs, [1, 2, 3])
  np.testing.assert_allclose(rewards.compute("exact_match", texts, refs, [1, 2], 0.5), [0.5, -1])


# ----------------------------------------------------------------------------- 8: custom rewards
@pytest.mark.parametrize("value", [None, float("nan"), float("inf"), "1"])
def test_registered_reward_returning_no_finite_number_is_named(monkeypatch, value):
  """A reward added to rewards.REWARDS returning None gave a bare TypeError, NaN a non-finite
  metrics error blaming the learning rate; now one error naming rl.reward, the row and value."""
  monkeypatch.setitem(rewards.REWARDS, "mine", lambda c, r: value if c == "bad" else 1.0)
  for name in ("mine", "exact_match+mine"):
    with pytest.raises(ValueError) as e:
      rewards.compute(name, ["ok", "bad"], ["#### 1", "#### 1"], [0, 0])
    msg = str(e.value)
    assert msg.startswith(f"rl.reward={name!r}: the reward 'mine' returned {value!r}"), msg
    assert "for completion row 1" in msg and "REWARDS['mine']" in msg
  with pytest.raises(ValueError, match="the reward 'mine' returned"):
    rewards.get("mine")("bad", "#### 1")
  monkeypatch.setitem(rewards.REWARDS, "mine", lambda c, r: np.float32(0.5))  # numbers pass
  np.testing.assert_allclose(rewards.compute("mine", ["a"], ["b"], [0]), [0.5])


# ----------------------------------------------------------------------------- 9: max_steps
@pytest.mark.parametrize("max_steps", [0, -1, 1.5, True])
def test_max_steps_below_one_is_refused_before_anything(tmp_path, max_steps):
  c = tiny_rl(str(tmp_path / "no_sft"))
  with pytest.raises(ValueError, match=f"max_steps={max_steps!r} must be an int >= 1"):
    grpo.train_rl(c, str(tmp_path / "rl"), max_steps=max_steps)
  assert not (tmp_path / "rl").exists()


def test_a_config_given_to_the_other_launcher_is_one_line(tmp_path):
  """Probe 18b: configs/rl_arithmetic.py given to launch/train.py (it sits beside the training
  configs) and a training config given to launch/rl.py ended in AttributeError tracebacks; each
  is one line naming the launcher it belongs to, before the workdir is touched."""
  from configs import rl_arithmetic, tiny_sw
  from setdiff_jax import train

  with pytest.raises(
    ValueError, match=r"no model section; it is an RL config: run it with launch/rl\.py"
  ):
    train.train_and_evaluate(rl_arithmetic.get_config(), str(tmp_path / "a"))
  with pytest.raises(ValueError, match=r"no model section; build it on configs/default\.py"):
    train.train_and_evaluate(rl_arithmetic.get_config().rl, str(tmp_path / "b"))
  with pytest.raises(
    ValueError, match=r"no rl section, so it is not an RL config .*launch/train\.py"
  ):
    grpo.train_rl(tiny_sw.get_config(), str(tmp_path / "c"))
  assert not os.listdir(tmp_path)
