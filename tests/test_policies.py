"""Commit policies (sampling/policies.py): hand-worked masks per policy, the config checks, and the
sampler invariants for every policy (>= 1 commit per live row per step, batch == rows alone with
mixed prompt lengths, cached == no-cache reference) on a cheap toy model; MDLM with `margin` and no
tau == a dense token-for-token reference (the official confidence_margin_based_noising)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from setdiff_jax.sampling import (
  CommitPolicy,
  DecodeSetting,
  SamplerConfig,
  commit_policy,
  bd3lm_generate,
  mdlm_generate,
  policies,
  set_generate,
  set_infill,
)
from setdiff_jax.sampling.policies import StepStats
from setdiff_jax.sampling.reference import reference_generate, reference_infill

# ------------------------------------------------------------------------------ hand-worked masks
#            slot:  0     1     2     3
PMAX = np.array([[0.90, 0.60, 0.95, 0.50]], np.float32)
ENT = np.array([[0.30, 0.90, 0.10, 1.20]], np.float32)
MARGIN = np.array([[0.85, 0.30, 0.90, 0.10]], np.float32)


def stats(streak=(1, 1, 1, 1), conf=None):
  cand = jnp.array([[11, 12, 13, 14]], jnp.int32)
  p = jnp.asarray(PMAX if conf is None else conf)
  return StepStats(
    cand=cand,
    conf=p,
    pmax=jnp.asarray(PMAX),
    margin=jnp.asarray(MARGIN),
    entropy=jnp.asarray(ENT),
    argmax=cand,
    streak=jnp.asarray([streak], jnp.int32),
  )


def mask(name, arg, count=1, valid=(1, 1, 1, 1), **kw):
  out = policies.commit(
    name, arg, stats(**kw), jnp.asarray([valid], bool), jnp.asarray([count], jnp.int32)
  )
  return np.asarray(out)[0].astype(int).tolist()


def test_threshold_hand_worked():
  assert mask("threshold", None) == [0, 0, 1, 0]  # n_i = 1: the most confident
  assert mask("threshold", 0.8) == [1, 0, 1, 0]  # + conf >= 0.8
  assert mask("threshold", 0.8, count=4) == [1, 1, 1, 1]  # n_i >= |valid| keeps all
  assert mask("threshold", None, count=0) == [1, 1, 1, 1]  # n_i == 0 keeps all (SPEC §8.13)
  # ranks by the chosen token's probability, not the max-probability
  assert mask("threshold", None, conf=np.array([[0.1, 0.2, 0.05, 0.3]], np.float32)) == [0, 0, 0, 1]


def test_pmax_hand_worked():
  # the chosen tokens' probabilities rank 3 > 1 > 0 > 2; the max-probabilities rank 2 > 0 > 1 > 3
  conf = np.array([[0.1, 0.2, 0.05, 0.3]], np.float32)
  assert mask("pmax", None, conf=conf) == [0, 0, 1, 0]  # n_i = 1: the highest pmax
  assert mask("pmax", 0.8, conf=conf) == [1, 0, 1, 0]  # + pmax >= 0.8 (not conf)
  assert mask("pmax", 0.6, count=3, conf=conf) == [1, 1, 1, 0]  # n_i is a floor; .6 >= .6
  assert mask("pmax", 2.0, conf=conf) == [0, 0, 1, 0]  # tau > 1 is off
  assert mask("pmax", None, count=0, conf=conf) == [1, 1, 1, 1]  # n_i == 0 keeps all
  assert mask("pmax", 0.8, valid=(1, 1, 0, 1), conf=conf) == [1, 0, 0, 0]
  # the same decisions as `threshold` when the chosen token is the argmax (greedy)
  assert mask("threshold", 0.8) == mask("pmax", 0.8, conf=conf)
  assert not policies.token_dependent("pmax") and policies.token_dependent("threshold")


def test_entropy_bound_hand_worked():
  # pmax order: 2 (H .1), 0 (.3), 1 (.9), 3 (1.2); sum H - max H over the prefixes: 0, .1, .4, 1.3
  assert mask("entropy_bound", 0.0) == [0, 0, 1, 0]
  assert mask("entropy_bound", 0.35) == [1, 0, 1, 0]
  assert mask("entropy_bound", 0.5) == [1, 1, 1, 0]
  assert mask("entropy_bound", 2.0) == [1, 1, 1, 1]
  assert mask("entropy_bound", 0.0, count=3) == [1, 1, 1, 0]  # n_i is a floor
  # an invalid slot neither commits nor spends the budget
  assert mask("entropy_bound", 0.5, valid=(1, 1, 0, 1)) == [1, 1, 0, 0]


def test_factor_hand_worked():
  # sorted pmax .95 .9 .6 .5 against 1 - f/(n+1); f=.4: .8 .867 .9 .92 -> n = 2
  assert mask("factor", 0.4) == [1, 0, 1, 0]
  # f=2: 0 .333 .5 .6 -> .6 >= .5 passes, .5 < .6 stops
  assert mask("factor", 2.0) == [1, 1, 1, 0]
  # f=.05: 1 - .025 = .975 > .95: nothing passes, the floor keeps one
  assert mask("factor", 0.05) == [0, 0, 1, 0]


def test_margin_hand_worked():
  assert mask("margin", None) == [0, 0, 1, 0]  # official: n_i largest margins
  assert mask("margin", None, count=2) == [1, 0, 1, 0]
  assert mask("margin", 0.25) == [1, 1, 1, 0]  # + margin >= tau
  # margin ranks differently from confidence: slot 0 beats slot 2 on margin here
  m = np.array([[0.95, 0.30, 0.90, 0.10]], np.float32)
  out = policies.commit(
    "margin",
    None,
    stats()._replace(margin=jnp.asarray(m)),
    jnp.ones((1, 4), bool),
    jnp.ones((1,), jnp.int32),
  )
  assert np.asarray(out)[0].astype(int).tolist() == [1, 0, 0, 0]


def test_topk_dilated_stable_hand_worked():
  assert mask("topk", 3) == [1, 1, 1, 0]
  assert mask("topk", 1, count=2) == [1, 0, 1, 0]  # max(k, n_i)
  assert mask("dilated", 2) == [1, 0, 1, 0]
  assert mask("dilated", 2, valid=(0, 1, 1, 1)) == [0, 1, 0, 1]  # from the first valid slot
  assert mask("dilated", 3, valid=(0, 1, 1, 1)) == [0, 1, 0, 0]
  assert mask("dilated", 1, valid=(0, 1, 1, 1)) == [0, 1, 1, 1]
  assert mask("stable", 2, streak=(1, 2, 3, 1)) == [0, 1, 1, 0]
  assert mask("stable", 3, streak=(1, 2, 1, 1)) == [0, 0, 1, 0]  # only the floor (best pmax)


def test_distribution_stats_against_numpy():
  """pmax, margin, entropy (natural log, 0 log 0 = 0) and argmax of probabilities [B, A, V]."""
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.full(7, 0.5), size=(2, 3)).astype(np.float32)
  probs[0, 0] = [0.5, 0.5, 0, 0, 0, 0, 0]  # zeros and a tie (the first maximum wins)
  pmax, margin, entropy, argmax = policies.distribution_stats(jnp.asarray(probs))
  p = probs.astype(np.float64)
  top = np.sort(p, -1)[..., ::-1]
  ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
  np.testing.assert_allclose(np.asarray(pmax), top[..., 0], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(margin), top[..., 0] - top[..., 1], atol=1e-6)
  np.testing.assert_allclose(np.asarray(entropy), ent, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(argmax), p.argmax(-1))
  assert float(entropy[0, 0]) == pytest.approx(np.log(2)) and float(margin[0, 0]) == 0.0


def test_dead_row_commits_nothing_and_rows_are_independent():
  s = StepStats(*[jnp.concatenate([x, x]) for x in stats()])
  valid = jnp.asarray([[1, 1, 1, 1], [0, 0, 0, 0]], bool)
  for name in policies.POLICIES:
    out = np.asarray(
      policies.commit(
        name, policies.check_arg(name, None), s, valid, jnp.asarray([1, 1], jnp.int32)
      )
    )
    assert out[0].sum() >= 1 and out[1].sum() == 0, name


def test_streaks_and_carry():
  carry = policies.carry_init(1, 6)
  pos = jnp.asarray([[2, 3, 4]])
  a1 = jnp.asarray([[7, 8, 9]], jnp.int32)
  s1 = policies.streaks(carry, pos, a1)
  assert np.asarray(s1).tolist() == [[1, 1, 1]]
  carry = policies.carry_update(carry, pos, jnp.asarray([[1, 1, 0]], bool), a1, s1)
  a2 = jnp.asarray([[5, 7, 8]], jnp.int32)
  pos2 = jnp.asarray([[1, 2, 3]])  # the window slid by one: position 2 keeps its argmax 7
  s2 = policies.streaks(carry, pos2, a2)
  assert np.asarray(s2).tolist() == [[1, 2, 2]]
  assert np.asarray(carry.argmax).tolist() == [[-1, -1, 7, 8, -1, -1]]  # slot 2 was not valid


def test_registry_and_bad_input():
  assert policies.DEFAULT == "threshold"
  assert policies.get("threshold").token_dependent
  assert not any(p.token_dependent for n, p in policies.POLICIES.items() if n != "threshold")
  with pytest.raises(ValueError, match="valid: threshold, entropy_bound, factor, margin"):
    CommitPolicy("nope")
  with pytest.raises(ValueError, match="must be a CommitPolicy"):
    SamplerConfig(mask_token_id=3, policy="pmax")
  for name, arg, what in (
    ("entropy_bound", -0.1, "gamma must be >= 0"),
    ("factor", 0.0, "f must be > 0"),
    ("topk", 0, "k must be >= 1"),
    ("topk", 1.5, "k must be an integer"),
    ("dilated", 0, "d must be >= 1"),
    ("stable", 0, "k must be >= 1"),
    ("margin", -1, "tau must be > 0"),
    # probe 17a: inf was refused with "gamma must be >= 0", which it is
    ("entropy_bound", float("inf"), "gamma must be a finite number"),
    ("factor", float("inf"), "f must be a finite number"),
    ("topk", float("inf"), "k must be a finite number"),
    ("margin", float("nan"), "tau must be a finite number"),
  ):
    with pytest.raises(ValueError, match=f"--policy_arg=.* for --policy={name}: {what}"):
      CommitPolicy(name, arg)
  with pytest.raises(ValueError, match="--threshold.*--policy_arg"):
    commit_policy("margin", threshold=0.9)
  with pytest.raises(ValueError, match="disagree"):
    commit_policy(policy_arg=0.8, threshold=0.9)
  with pytest.raises(ValueError, match="--threshold=1.5 for --policy=threshold: tau must be"):
    commit_policy(threshold=1.5)
  assert commit_policy(threshold=0.9).param == 0.9 and CommitPolicy("topk").param == 2
  assert policies.parse_arg("off") is None and policies.parse_arg("0.5") == 0.5
  with pytest.raises(ValueError, match="--policy_arg='x'"):
    policies.parse_arg("x")
  assert policies.label("entropy_bound", None) == "entropy_bound gamma=0.1"


# ------------------------------------------------------------------------------ sampler invariants
V = 24
PAD, BOS, EOS, M = 0, 1, 2, 3
TABLE = jnp.asarray(np.random.default_rng(0).normal(0, 2.5, (97, V)), jnp.float32)


def hash_toy(tokens, positions, mask, kv_cache):
  """Varied distributions that depend on the query position and on the visible clean keys (their
  count and token sum; a smaller term, so an argmax often survives a step): a row-local function
  of what the query sees, like a model."""
  tok = tokens.astype(jnp.int32)[..., None]
  keys = tok if kv_cache is None else jnp.concatenate([kv_cache[0], tok], 1)
  kt = keys[..., 0]
  seen = mask & ((kt != M) & (kt != PAD))[:, None, :]
  count = jnp.sum(seen, -1)
  total = jnp.sum(jnp.where(seen, kt[:, None, :], 0), -1)
  idx = (positions * 7 + count * 13 + total * 3) % TABLE.shape[0]
  return TABLE[positions % TABLE.shape[0]] + 0.6 * TABLE[idx], (tok,)


PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 4, 6]]
ARGS = {
  "threshold": 0.5,
  "entropy_bound": 0.8,
  "factor": 1.0,
  "margin": 0.4,
  "topk": 2,
  "dilated": 2,
  "stable": 2,
  "pmax": 0.5,
}


def cfg_for(name, **kw):
  base = dict(
    mask_token_id=M,
    eos_token_id=EOS,
    pad_token_id=PAD,
    bos_token_id=BOS,
    window=4,
    max_new_tokens=10,
    stop_at_eos=False,
    policy=CommitPolicy(name, kw.pop("policy_arg", ARGS[name])),
  )
  base.update(kw)
  return SamplerConfig(**base)


def assert_every_step_commits(out):
  for b in range(len(out.num_steps)):
    steps = set(out.commit_step[b][out.commit_step[b] >= 0].tolist())
    assert steps == set(range(int(out.num_steps[b]))), (b, steps, out.num_steps[b])


@pytest.mark.slow  # 7 policies x 4 compiled loops (~10 s each on 2 cores)
@pytest.mark.parametrize("name", list(policies.POLICIES))
def test_set_sampler_invariants(name):
  cfg = cfg_for(name)
  out = set_generate(hash_toy, None, PROMPTS, cfg)
  assert_every_step_commits(out)
  assert all(len(g) == 10 for g in out.generated)
  ref = reference_generate(hash_toy, None, PROMPTS, cfg)
  np.testing.assert_array_equal(out.canvas, ref.canvas)
  np.testing.assert_array_equal(out.commit_step, ref.commit_step)
  for i in (1, 2):  # the shortest row (padded in the batch) and a middle one
    p = PROMPTS[i]
    alone = set_generate(hash_toy, None, [p], cfg)
    assert alone.generated[0] == out.generated[i], (name, i)
    np.testing.assert_array_equal(
      alone.commit_step[0, : len(p) + 10], out.commit_step[i, : len(p) + 10]
    )
  if name != "threshold":  # the parameters above make every other policy go parallel here
    assert out.tokens_per_step > 1.0, name


@pytest.mark.slow
@pytest.mark.parametrize("name", list(policies.POLICIES))
def test_block_samplers_invariants(name):
  for gen, kw in ((bd3lm_generate, dict(block_size=4)), (mdlm_generate, dict(block_size=5))):
    cfg = cfg_for(name, **kw)
    out = gen(hash_toy, None, PROMPTS, cfg)
    assert_every_step_commits(out)
    for i in (1,):
      p = PROMPTS[i]
      alone = gen(hash_toy, None, [p], cfg)
      assert alone.generated[0] == out.generated[i], (name, gen.__name__, i)


def test_infill_with_a_policy_keeps_context():
  canvas = [1, 5, M, M, M, 6, M, M, 7]
  cfg = cfg_for("entropy_bound")
  out = set_infill(hash_toy, None, [canvas], cfg)
  ref = reference_infill(hash_toy, None, [canvas], cfg)
  np.testing.assert_array_equal(out.canvas, ref.canvas)
  assert [out.canvas[0][i] for i in (0, 1, 5, 8)] == [1, 5, 6, 7]
  assert M not in out.canvas[0].tolist()


def test_threshold_flag_and_policy_arg_are_one_tau():
  # --threshold is the reference's name for tau of --policy=threshold: one CommitPolicy, one loop
  one = CommitPolicy("threshold", 0.5)
  assert commit_policy(threshold=0.5) == commit_policy("threshold", 0.5) == one
  assert commit_policy(policy_arg=0.5, threshold=0.5) == one
  assert hash(commit_policy(threshold=0.5)) == hash(one)  # a jit static: the same program
  a = set_generate(hash_toy, None, PROMPTS, cfg_for("threshold", policy_arg=None))
  assert cfg_for("threshold").policy == one and a.tokens_per_step == 1.0  # tau off: one per step


def test_mdlm_margin_without_tau_is_token_for_token():
  # MDLM (no cache, every key visible, G = N): one commit per step, by margin rank
  prompts = [[1, 5, 6], [1, 9, 4, 7]]
  cfg = cfg_for("margin", policy_arg=None, block_size=None, mdlm_pad_to_max_length=False)
  out = mdlm_generate(hash_toy, None, prompts, cfg)
  assert out.num_steps.tolist() == [10, 10] and out.tokens_per_step == 1.0
  # the dense reference sees the whole canvas (MDLM's bidirectional attention): block = all N
  want = []
  for p in prompts:
    x = np.array(list(p) + [M] * 10)
    for _ in range(10):
      logits, _ = hash_toy(
        jnp.asarray(x[None]), jnp.arange(len(x))[None], jnp.ones((1, len(x), len(x)), bool), None
      )
      prob = np.asarray(jax.nn.softmax(logits.at[..., M].set(-1e12), -1))[0]
      top = -np.sort(-prob, -1)
      marg = np.where(x == M, top[:, 0] - top[:, 1], -1.0)
      j = int(np.argmax(marg))
      x[j] = int(np.argmax(prob[j]))
    want.append(x[len(p) :].tolist())
  assert out.generated == want
  bd = bd3lm_generate(hash_toy, None, prompts, cfg_for("margin", policy_arg=None, block_size=4))
  assert bd.tokens_per_step == 1.0 and bd.num_steps.tolist() == [10, 10]


def test_bd3lm_last_partial_block_caches_the_whole_previous_block():
  # N = 10, S = 4: the last block of the short row runs past the canvas of that row alone; its
  # fused step must still cache all of the previous block (it once cached clipped positions, so a
  # row decoded alone differed from the same row in a batch with a longer prompt).
  cfg = cfg_for("threshold", policy_arg=None, block_size=4)
  both = bd3lm_generate(hash_toy, None, [PROMPTS[0], PROMPTS[1]], cfg)
  alone = bd3lm_generate(hash_toy, None, [PROMPTS[1]], cfg)
  assert alone.generated[0] == both.generated[1]


def test_evaluation_settings_and_labels():
  from setdiff_jax.decoding import sampler_config_for, sampler_settings
  from setdiff_jax import decoders
  from setdiff_jax.diffusion import losses
  from setdiff_jax.evaluation import generation

  oc = losses.ObjectiveConfig(
    name="setdlm", mask_token_id=3, eos_token_id=2, pad_token_id=0, desired_set_size=4
  )
  base = generation.decoding_settings(oc, windows=[4, 8], thresholds=[None])
  out = generation.with_policy(oc, base, "entropy_bound", [0.1, 0.5])
  assert [(s.window, s.policy.arg) for s in out] == [(4, 0.1), (4, 0.5), (8, 0.1), (8, 0.5)]
  assert out[1].name == "W=4 entropy_bound gamma=0.5"
  assert generation.with_policy(oc, base, "threshold") == base
  with pytest.raises(ValueError, match="--thresholds"):
    generation.with_policy(oc, generation.decoding_settings(oc, thresholds=[0.9]), "margin")
  with pytest.raises(ValueError, match="--policy_args=-1"):
    generation.with_policy(oc, base, "entropy_bound", [-1])
  ar = losses.ObjectiveConfig(name="ar", mask_token_id=3, eos_token_id=2, pad_token_id=0)
  ar_settings = generation.decoding_settings(ar)
  assert ar_settings == [DecodeSetting(None, None)] and ar_settings[0].name == "-"
  assert generation.with_policy(ar, ar_settings, "topk", [2]) == ar_settings  # no commit rule
  mdlm = losses.ObjectiveConfig(name="mdlm", mask_token_id=3, eos_token_id=2, pad_token_id=0)
  assert [s.name for s in generation.decoding_settings(mdlm)] == ["tau=off", "tau=0.9"]
  cfg = sampler_config_for(oc, None, 32, setting=out[0])
  assert (cfg.policy, cfg.window, cfg.setting) == (CommitPolicy("entropy_bound", 0.1), 4, out[0])
  assert "policy=entropy_bound gamma=0.1" in sampler_settings(decoders.get("setdlm"), oc, cfg)


def test_benchmark_choice_rule_and_paired_bootstrap():
  import importlib.util
  import os

  path = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "speed_accuracy.py"
  )
  spec = importlib.util.spec_from_file_location("speed_accuracy_unit", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  rows = [
    {"accuracy": 0.80, "kept_tokens_per_call": 1.0, "policy_arg": None},
    {"accuracy": 0.795, "kept_tokens_per_call": 1.5, "policy_arg": 0.1},
    {"accuracy": 0.70, "kept_tokens_per_call": 3.0, "policy_arg": 1.0},
  ]
  assert bench.choose(rows, 0.80)["policy_arg"] == 0.1  # fastest within 1 point
  assert bench.choose(rows[1:], 0.90)["policy_arg"] == 0.1  # none within: the most accurate
  a = {"correct": [1, 1, 0, 0], "kept": [4, 4, 4, 4], "calls": [2, 2, 2, 2]}
  b = {"correct": [1, 0, 0, 0], "kept": [4, 4, 4, 4], "calls": [4, 4, 4, 4]}
  ci = bench.paired_ci(a, b, 200)
  assert ci["acc_diff"] == 0.25 and ci["speedup"] == 2.0 and ci["speedup_ci"] == [2.0, 2.0]
  assert 0.0 <= ci["acc_diff_ci"][0] <= 0.25 <= ci["acc_diff_ci"][1] <= 1.0  # per-problem 0 or 1
  same = bench.paired_ci(a, a, 50)
  assert same["acc_diff_ci"] == [0.0, 0.0] and same["speedup"] == 1.0
  # two seeds that disagree (a: 2/2 right on seed 0, 0/2 on seed 1): resampling seeds puts
  # both extremes in the interval; the pooled-pairs view (one "seed") cannot reach them
  a20 = {"correct": [1] * 10 + [0] * 10, "kept": [4] * 20, "calls": [2] * 20}
  b20 = {"correct": [0] * 20, "kept": [4] * 20, "calls": [2] * 20}
  two = bench.paired_ci(a20, b20, 400, n_seeds=2)
  flat = bench.paired_ci(a20, b20, 400, n_seeds=1)
  assert (
    two["acc_diff_ci"] == [0.0, 1.0] and 0.2 < flat["acc_diff_ci"][0] < flat["acc_diff_ci"][1] < 0.8
  )
  with pytest.raises(ValueError, match="3 seeds"):
    bench.paired_ci(a, b, 10, n_seeds=3)  # 4 results are not 3 seeds x the same problems


def test_benchmark_matched_speed_pairing_and_grid_flag():
  """summarize pairs a policy with the threshold rule's own choice and with the tau whose
  validation kept/call is nearest (per seed); --policy_grid parses and checks ranges."""
  import importlib.util
  import os

  path = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "speed_accuracy.py"
  )
  spec = importlib.util.spec_from_file_location("speed_accuracy_unit2", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  assert bench.parse_grid("factor:1/2,threshold:off/0.9") == {
    "factor": (1.0, 2.0),
    "threshold": (None, 0.9),
  }
  for bad in ("factor:0", "nope:1", "topk:"):
    with pytest.raises(ValueError):
      bench.parse_grid(bad)
  assert bench.chain_seq_len(4, 99) == 40  # 12 prompt + 12 + 8 answer + BOS/EOS = 34 -> 40
  pe = lambda c, k, f: {"correct": c, "kept": k, "calls": f}
  off, t9, t5 = (
    pe([1, 1, 0, 0], [4] * 4, [4] * 4),
    pe([1, 0, 0, 0], [4] * 4, [2] * 4),
    pe([0, 0, 0, 0], [4] * 4, [1] * 4),
  )
  val = lambda a, k: {"policy_arg": a, "kept_tokens_per_call": k, "accuracy": 0.5}
  thr = {
    "task": "chain",
    "method": "setdlm4",
    "seed": 0,
    "window": 4,
    "policy": "threshold",
    "chosen_arg": 0.9,
    "val": [val(None, 1.0), val(0.9, 2.0), val(0.5, 4.0)],
    "test": {"accuracy": 0.25},
    "per_example": t9,
    "ref_test": {"accuracy": 0.5},
    "ref_per_example": off,
    "grid_test": [
      {"arg": None, "per_example": off},
      {"arg": 0.9, "per_example": t9},
      {"arg": 0.5, "per_example": t5},
    ],
  }
  pol = {
    "task": "chain",
    "method": "setdlm4",
    "seed": 0,
    "window": 4,
    "policy": "factor",
    "chosen_arg": 2.0,
    "val_pick": val(2.0, 3.5),
    "test": {
      "accuracy": 0.5,
      "kept_tokens_per_call": 4 / 1.0,
      "tokens_per_second": 1.0,
      "copy_fraction": 0.0,
    },
    "per_example": pe([1, 1, 0, 0], [4] * 4, [1] * 4),
  }
  thr["test"].update(kept_tokens_per_call=2.0, tokens_per_second=1.0, copy_fraction=0.0)
  rows = {r["policy"]: r for r in bench.summarize([thr, pol], 50)}
  f = rows["factor"]
  assert f["speedup"] == 4.0 and f["acc_diff"] == 0.0  # vs tau off
  assert f["vs_thr"]["speedup"] == 2.0 and f["vs_thr"]["acc_diff"] == 0.25  # vs tau = 0.9
  assert f["match_args"] == [0.5]  # val 3.5 is nearest to 4.0
  assert f["vs_match"]["speedup"] == 1.0 and f["vs_match"]["acc_diff"] == 0.5
  assert rows["threshold"]["ref_seed_accuracies"] == [0.5]
  assert "| chain | setdlm4 | 4 | factor | 2 | 0.5 |" in bench.matched_table(list(rows.values()))


def test_benchmark_resumes_per_policy_and_reports_partial_runs(tmp_path, monkeypatch):
  """An interrupted policy evaluation keeps the policies it finished (cache per seed/method), a
  re-run evaluates only the rest, and --report_only reports what is there, labelled."""
  import importlib.util
  import os

  path = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "speed_accuracy.py"
  )
  spec = importlib.util.spec_from_file_location("speed_accuracy_unit3", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  pe = {"correct": [1, 0], "kept": [2, 2], "calls": [1, 2]}
  slim = {
    "accuracy": 0.5,
    "kept_tokens_per_call": 4 / 3,
    "tokens_per_second": 1.0,
    "copy_fraction": 0.0,
    "policy_arg": None,
  }
  calls, kill = [], [True]

  def fake_eval(method, workdir, task, p, seed, log, prior=(), save=None):
    out = list(prior)
    for policy in p["policies"]:
      if any(r["policy"] == policy for r in out):
        continue
      calls.append(policy)
      if policy == "factor" and kill[0]:
        raise KeyboardInterrupt  # killed after the threshold rule
      out.append(
        {
          "task": task,
          "method": method,
          "seed": seed,
          "window": 4,
          "policy": policy,
          "chosen_arg": None,
          "val": [dict(slim)],
          "val_pick": dict(slim),
          "test": dict(slim),
          "per_example": pe,
          "ref_test": dict(slim),
          "ref_per_example": pe,
          "grid_test": [{"arg": None, "test": dict(slim), "per_example": pe}],
        }
      )
      save(out)
    return out

  monkeypatch.setattr(bench, "policy_eval", fake_eval)
  monkeypatch.setattr(bench, "shared_tokenizer", lambda sub, c: "tok")
  monkeypatch.setattr(
    bench, "train_method", lambda m, c, sub, tok, log: {"workdir": sub, "train_seconds": 1.0}
  )
  argv = [
    "--policies=threshold,factor",
    "--methods=setdlm4",
    "--tasks=chain",
    "--seeds=0",
    f"--output_dir={tmp_path}",
    "--results_dir=none",
    "--bootstrap=10",
  ]
  with pytest.raises(KeyboardInterrupt):
    bench.main(argv, log=lambda *a: None)
  rec = bench.main(argv + ["--report_only"], log=lambda *a: None)
  assert rec["finished"] == ["chain setdlm4 seed 0 (policies threshold only)"]
  assert {r["policy"] for r in rec["summary"]} == {"threshold"}
  calls.clear()
  kill[0] = False
  rec = bench.main(argv, log=lambda *a: None)
  assert calls == ["factor"] and rec["finished"] == ["chain setdlm4 seed 0"]
  assert {r["policy"] for r in rec["summary"]} == {"threshold", "factor"}


def test_a_tau_of_07_is_never_named_tau_off():
  """Every way a report builds a tau = 0.7 setting names it 'W=4 tau=0.7' (rl_chain_5000.json
  once recorded the threshold rule's tau given as its policy argument as 'W=4 tau=off')."""
  from setdiff_jax import decoders
  from setdiff_jax.decoding import sampler_config_for, sampler_settings
  from setdiff_jax.diffusion import losses
  from setdiff_jax.evaluation import generation

  oc = losses.ObjectiveConfig(
    name="setdlm", mask_token_id=3, eos_token_id=2, pad_token_id=0, desired_set_size=4
  )
  ways = {
    "--thresholds": generation.decoding_settings(oc, thresholds=[0.7])[0],
    "policy argument (rl_result, speed_accuracy)": DecodeSetting(4, CommitPolicy("threshold", 0.7)),
    "--threshold": sampler_config_for(oc, None, 32, threshold=0.7).setting,
    "--policy_arg": sampler_config_for(oc, None, 32, policy="threshold", policy_arg=0.7).setting,
    "both flags": sampler_config_for(oc, None, 32, threshold=0.7, policy_arg=0.7).setting,
  }
  for way, setting in ways.items():
    assert setting == DecodeSetting(4, CommitPolicy("threshold", 0.7)), way
    assert setting.name == "W=4 tau=0.7", way
    row = setting.row()
    assert (row["setting"], row["threshold"], row["policy_arg"]) == ("W=4 tau=0.7", "0.7", 0.7)
    cfg = sampler_config_for(oc, None, 32, setting=setting)
    header = sampler_settings(decoders.get("setdlm"), oc, cfg)
    assert "tau=0.7" in header and "tau=off" not in header, (way, header)
  assert DecodeSetting(4, CommitPolicy()).name == "W=4 tau=off"
