"""Exact trajectory scoring (rl/scoring.py, issue 28): the scorer against the samplers' own
log-probabilities (setdlm, ar, bd3lm; mixed prompt lengths), against a dense step-by-step
recomputation without the cache, against Monte-Carlo frequencies of enumerable trajectories (and
the token-dependent `threshold` rule failing that test), the hand-worked counterexample of the
issue, and the bad-input errors of the RL sampling mode."""
import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_dit
from setdiff_jax import cli
from setdiff_jax.diffusion import masks
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.models.layers import suppress_mask_logit
from setdiff_jax.rl import scoring
from setdiff_jax.sampling import (SampleOutput, SamplerConfig, ar_generate, bd3lm_generate,
                                  policies, set_generate, set_infill)
from setdiff_jax.sampling.cache import backbone_apply_fn
from setdiff_jax.sampling.policies import StepStats

M = 3
PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 4, 6]]  # mixed lengths: rows are padded in the batch
CANVASES = [[1, 5, M, M, 6, M, M, 7], [1, M, M, M, 9]]  # infilling: context on both sides


def infill(model, params, _, cfg, rng):
  return set_infill(model, params, CANVASES, cfg, rng)


@functools.lru_cache(maxsize=None)
def tiny(vocab: int, seed: int = 0):
  return random_dit(DiTConfig(vocab_size=vocab, hidden_size=32, num_layers=1, num_heads=2,
                              dropout=0.0), seed)


def rl_cfg(**kw):
  base = dict(mask_token_id=M, pad_token_id=0, max_new_tokens=7, greedy=False, temperature=0.7,
              window=4, stop_at_eos=False)
  base.update(kw)
  return SamplerConfig(**base)


def score(method, out, cfg, model, params, rows=False):
  fn = scoring.token_logits if rows else scoring.token_logprobs
  jitted = jax.jit(fn, static_argnums=(0, 1),
                   static_argnames=("temperature", "mask_token_id", "block_size", "max_steps"))
  return np.asarray(jitted(method, model, params, scoring.rollout_from_output(out),
                           temperature=cfg.temperature, mask_token_id=cfg.mask_token_id,
                           block_size=cfg.block_size))


# ------------------------------------------------------------------------------ scorer == sampler
CASES = {
    "setdlm_pmax": ("setdlm", set_generate, dict(policy="pmax", policy_arg=0.3)),
    "setdlm_topk_fht": ("setdlm", set_generate, dict(policy="topk", policy_arg=2,
                                                     cache_order="fht")),
    "ar": ("ar", ar_generate, {}),
    "bd3lm_topk": ("bd3lm", bd3lm_generate, dict(policy="topk", policy_arg=2, block_size=4)),
    "bd3lm_aligned": ("bd3lm", bd3lm_generate, dict(policy="pmax", policy_arg=0.3, block_size=4,
                                                    align_to_blocks=True)),
    "setdlm_infill": ("setdlm", infill, dict(policy="pmax", policy_arg=0.3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scorer_equals_the_samplers_logprobs(case):
  method, gen, kw = CASES[case]
  model, params = tiny(16)
  cfg = rl_cfg(**kw)
  scoring.check_exact(method, cfg)
  out = gen(model, params, PROMPTS, cfg, jax.random.PRNGKey(1))
  lp = score(method, out, cfg, model, params)
  gen_mask = out.target & (out.commit_step >= 0)
  n = sum(c.count(M) for c in CANVASES) if gen is infill else 3 * 7
  if cfg.align_to_blocks:  # aligned blocks may leave the span's tail undecoded
    assert n - 3 * 3 <= gen_mask.sum() < n
  else:
    assert gen_mask.sum() == n
  assert np.all(out.token_logprob[~gen_mask] == 0)
  np.testing.assert_allclose(lp, out.token_logprob, atol=1e-5, rtol=0)
  assert np.all(lp[gen_mask] < 0)  # the comparison is not between zeros
  if method != "ar":
    assert out.tokens_per_step > 1.0  # several commits per step were scored
  # the scorer's rows are the log-softmax rows behind the log-probs
  rows = score(method, out, cfg, model, params, rows=True)
  np.testing.assert_allclose(np.take_along_axis(rows, out.canvas[..., None], -1)[..., 0], lp,
                             atol=1e-6)
  np.testing.assert_allclose(np.exp(rows[gen_mask]).sum(-1), 1.0, atol=1e-5)


def test_setdlm_scorer_equals_a_dense_step_by_step_recomputation():
  """Each step recomputed without any cache: [clean tokens committed before the step, in cache
  order, causal | the step's committed positions as masks] (the no-cache reference's layout,
  `masks.cached_step_mask` with an empty cache), one uncached forward per step."""
  model, params = tiny(16)
  cfg = rl_cfg(**CASES["setdlm_topk_fht"][2])  # the sampler compiled above
  out = set_generate(model, params, PROMPTS, cfg, jax.random.PRNGKey(3))
  rows = score("setdlm", out, cfg, model, params, rows=True)
  r = scoring.rollout_from_output(out)
  apply = backbone_apply_fn(model.config)
  b, lc = r.tokens.shape
  checked = 0
  for t in range(int(out.num_steps.max())):
    clean_tok = np.zeros((b, lc), np.int32)
    clean_pos = np.zeros((b, lc), np.int32)
    clean_ok = np.zeros((b, lc), bool)
    act_pos = np.zeros((b, lc), np.int32)
    act_ok = np.zeros((b, lc), bool)
    for i in range(b):
      seen = np.nonzero(r.valid[i] & (r.commit_step[i] < t))[0]
      seen = seen[np.argsort(r.cache_order[i][seen])]
      clean_tok[i, :len(seen)] = r.tokens[i, seen]
      clean_pos[i, :len(seen)] = seen
      clean_ok[i, :len(seen)] = True
      now = np.nonzero(r.commit_step[i] == t)[0]
      act_pos[i, :len(now)] = now
      act_ok[i, :len(now)] = True
    tokens = np.concatenate([clean_tok, np.full((b, lc), M, np.int32)], -1)
    mask = masks.cached_step_mask(jnp.zeros((b, 0), bool), clean_ok, act_ok)
    logits, _ = apply(params, jnp.asarray(tokens), jnp.asarray(np.concatenate(
        [clean_pos, act_pos], -1)), mask, None, lc)
    want = jax.nn.log_softmax(suppress_mask_logit(logits, M) / cfg.temperature, -1)
    got = np.take_along_axis(rows, act_pos[..., None], 1)
    np.testing.assert_allclose(got[act_ok], np.asarray(want)[act_ok], atol=2e-5)
    checked += act_ok.sum()
  assert checked == 3 * 7


def test_scorer_is_jittable_and_differentiable():
  model, params = tiny(16)
  cfg = rl_cfg(**CASES["setdlm_pmax"][2])  # the sampler compiled above
  out = set_generate(model, params, PROMPTS, cfg, jax.random.PRNGKey(0))
  r = scoring.rollout_from_output(out)

  def total(p):
    return jnp.sum(scoring.token_logprobs("setdlm", model, p, r, temperature=cfg.temperature,
                                          mask_token_id=M))
  value, grads = jax.jit(jax.value_and_grad(total))(params)
  np.testing.assert_allclose(value, out.token_logprob.sum(), atol=1e-5)
  norms = [float(jnp.linalg.norm(g)) for g in jax.tree_util.tree_leaves(grads)]
  assert all(np.isfinite(norms)) and max(norms) > 0


# ------------------------------------------------------------------------------ hand-worked
def committed_first(rule, a_dist, b_dist, want_a, want_b):
  """P(position A commits first with token want_a, then B with want_b): two positions with fixed
  distributions, one commit per step, every candidate drawn each step (the losing draw is
  discarded and B is drawn afresh at the next step), `rule` a registry policy with tau off."""
  total = 0.0
  for a in range(2):
    for b in range(2):
      stats = StepStats(cand=jnp.array([[a, b]]), conf=jnp.array([[a_dist[a], b_dist[b]]]),
                        pmax=jnp.array([[max(a_dist), max(b_dist)]]),
                        margin=jnp.zeros((1, 2)), entropy=jnp.zeros((1, 2)),
                        argmax=jnp.zeros((1, 2), jnp.int32), streak=jnp.ones((1, 2), jnp.int32))
      keep = np.asarray(policies.commit(rule, None, stats, jnp.ones((1, 2), bool),
                                        jnp.ones((1,), jnp.int32)))[0]
      if keep.tolist() == [True, False] and a == want_a:
        total += a_dist[a] * b_dist[b] * b_dist[want_b]
  return total


def test_issue_counterexample_threshold_is_not_the_product_pmax_is():
  a_dist, b_dist = (0.6, 0.4), (0.9, 0.1)
  product = 0.6 * 0.9  # the formula: p(a0) * p(b0)
  # threshold (ranks by the sampled token): A = a0 commits first only if B drew b1
  assert committed_first("threshold", a_dist, b_dist, 0, 0) == pytest.approx(0.6 * 0.1 * 0.9)
  assert abs(committed_first("threshold", a_dist, b_dist, 0, 0) - product) > 0.4
  # pmax (ranks by max-probability): B always commits first, so the A-first trajectory has
  # probability 0, and the B-first ones have exactly the product of their tokens' probabilities
  assert committed_first("pmax", a_dist, b_dist, 0, 0) == 0.0
  assert committed_first("pmax", b_dist, a_dist, 0, 0) == pytest.approx(product)  # B first


# ------------------------------------------------------------------------------ Monte Carlo
def chi_square(keys: np.ndarray, logp: np.ndarray):
  """(statistic, degrees of freedom, its 0.999 quantile, sum of exp(score) over the distinct
  observed trajectories): cells = trajectories expected >= 5 times, plus one cell for the rest."""
  _, first, inv, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True,
                                    return_counts=True)
  expect = np.exp(logp[first]) * len(keys)
  big = expect >= 5
  stat = float(np.sum((counts[big] - expect[big]) ** 2 / expect[big]))
  rest_o, rest_e = counts[~big].sum(), len(keys) - expect[big].sum()
  if rest_e > 5:
    stat += (rest_o - rest_e) ** 2 / rest_e
    df = int(big.sum())
  else:
    df = int(big.sum()) - 1
  z = 3.090232  # the 0.999 normal quantile; Wilson-Hilferty for the chi-square quantile
  q = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
  return stat, df, q, float(np.exp(logp[first]).sum())


def monte_carlo(method, gen, cfg, rows: int):
  """Samples `rows` rollouts (two prompts of different lengths, interleaved) in one jitted call,
  scores each distinct trajectory once, returns chi_square(...) per prompt."""
  model, params = tiny(4)
  prompts = [[1], [2, 0, 1]] * (rows // 2)
  out = gen(model, params, prompts, cfg, jax.random.PRNGKey(7))
  r = scoring.rollout_from_output(out)
  keys = np.concatenate([r.tokens, r.commit_step], -1)  # tokens + commit steps
  _, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
  distinct = scoring.Rollout(*[np.asarray(x)[first] for x in r])
  lp = scoring.token_logprobs(method, model, params, distinct, temperature=cfg.temperature,
                              mask_token_id=M)
  logp = np.asarray(lp, np.float64).sum(-1)[inv.reshape(-1)]
  parallel = out.tokens_per_step
  return [chi_square(keys[i::2], logp[i::2]) for i in (0, 1)], parallel, keys


@pytest.mark.slow  # 4 x 1e5 rollouts: ~7 min wall on 2 cores shared at load ~27
def test_monte_carlo_frequencies_match_exp_score():
  """3 real tokens (V = 4 with M), 3 generated positions, W = 3: every trajectory (tokens and
  commit steps) is seen in 1e5 rollouts, and their frequencies match exp(score) (chi-square at
  the 0.999 level, fixed seeds). pmax at tau = .77 (temperature 1.5) commits one or two tokens
  per step depending on the drawn history, topk k = 2 commits 2 then 1 (1.5 tokens per step); the
  token-dependent threshold with the same tau fails the same test by orders of magnitude (its
  scores do not even sum to 1)."""
  base = dict(mask_token_id=M, pad_token_id=0, max_new_tokens=3, greedy=False, window=3,
              stop_at_eos=False, temperature=1.5)
  rows = 100_000
  exact = {"setdlm pmax": ("setdlm", set_generate, SamplerConfig(**base, policy="pmax",
                                                                 policy_arg=0.77)),
           "setdlm topk": ("setdlm", set_generate, SamplerConfig(**base, policy="topk",
                                                                 policy_arg=2)),
           "ar": ("ar", ar_generate, SamplerConfig(**base))}
  for name, (method, gen, cfg) in exact.items():
    stats, parallel, keys = monte_carlo(method, gen, cfg, rows)
    for stat, df, q, total in stats:
      assert stat < q, (name, stat, df, q)
      assert total == pytest.approx(1.0, abs=1e-3), name  # all trajectories were observed
      assert df >= 15, name
    if name == "setdlm topk":
      assert parallel == 1.5  # 2 + 1 commits on every row
    if name == "setdlm pmax":
      steps = keys[:, keys.shape[1] // 2:]
      per_step = [np.bincount(s[s >= 0]).max() for s in steps[::2][:2000]]
      assert 1.0 < parallel < 3.0 and max(per_step) == 2 and min(per_step) == 1
  cfg = SamplerConfig(**base, policy="threshold", threshold=0.77)
  stats, _, _ = monte_carlo("setdlm", set_generate, cfg, rows)
  for stat, df, q, total in stats:
    assert stat > 10 * q and total > 2.0, (stat, q, total)


# ------------------------------------------------------------------------------ bad input
def error_line(fn) -> str:
  with pytest.raises(ValueError) as e:
    fn()
  stream = io.StringIO()
  cli.report(e.value, stream)
  lines = stream.getvalue().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  return lines[0]


@pytest.mark.parametrize("kw, method, expect", [
    (dict(policy="threshold", threshold=0.9), "setdlm", "--policy=threshold .*--policy=pmax"),
    (dict(policy="threshold"), "bd3lm", "--policy=threshold .*--policy=pmax"),
    (dict(policy="pmax", top_p=0.9), "setdlm", "top_p=0.9: .*use top_p=1.0"),
    (dict(policy="pmax", repetition_penalty=1.2), "setdlm",
     "repetition_penalty=1.2: .*use repetition_penalty=1.0"),
    (dict(policy="pmax", greedy=True), "setdlm", "greedy=True: .*greedy=False"),
    (dict(top_p=0.95), "ar", "top_p=0.95"),
    (dict(policy="pmax"), "mdlm", "objective=mdlm: .*supports setdlm, ar, bd3lm"),
])
def test_inexact_settings_are_one_error_line(kw, method, expect):
  import re
  line = error_line(lambda: scoring.check_exact(method, rl_cfg(**kw)))
  assert re.search(expect, line), line


def test_exact_settings_pass_and_mdlm_output_is_refused():
  scoring.check_exact("ar", rl_cfg())  # AR has no commit policy: threshold is irrelevant
  for name, p in policies.POLICIES.items():
    if not p.token_dependent:
      scoring.check_exact("setdlm", rl_cfg(policy=name))
  out = SampleOutput(sequences=[[1]], generated=[[]], canvas=np.zeros((1, 2), np.int32),
                     target=np.zeros((1, 2), bool), commit_step=np.full((1, 2), -1),
                     num_steps=np.zeros(1), forward_calls=np.zeros(1),
                     num_committed=np.zeros(1), stopped=np.zeros(1, bool))
  assert "MDLM has no cache" in error_line(lambda: scoring.rollout_from_output(out))
