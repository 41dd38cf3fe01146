"""Exact trajectory scoring (rl/scoring.py, issue 28): the scorer against the samplers' own
log-probabilities (setdlm, ar, bd3lm; mixed prompt lengths), against dense step-by-step
recomputations without the cache (setdlm; bd3lm in the training layout), against Monte-Carlo frequencies of enumerable trajectories (and
the token-dependent `threshold` rule failing that test), the hand-worked counterexample of the
issue, and the bad-input errors of the RL sampling mode."""

import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_dit, random_params
from setdiff_jax import cli
from setdiff_jax.diffusion import masks
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.models.qwen3 import Qwen3, Qwen3Config
from setdiff_jax.models.layers import suppress_mask_logit
from setdiff_jax.rl import objective, scoring
from setdiff_jax.sampling import (
  SampleOutput,
  CommitPolicy,
  SamplerConfig,
  commit_policy,
  ar_generate,
  bd3lm_generate,
  policies,
  set_generate,
  set_infill,
)
from setdiff_jax.sampling.cache import Forward, backbone_apply_fn
from setdiff_jax.sampling.policies import StepStats

M = 3
PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 4, 6]]  # mixed lengths: rows are padded in the batch
CANVASES = [[1, 5, M, M, 6, M, M, 7], [1, M, M, M, 9]]  # infilling: context on both sides


def infill(model, params, _, cfg, rng):
  return set_infill(model, params, CANVASES, cfg, rng)


@functools.lru_cache(maxsize=None)
def tiny(vocab: int, seed: int = 0):
  return random_dit(
    DiTConfig(vocab_size=vocab, hidden_size=32, num_layers=1, num_heads=2, dropout=0.0), seed
  )


def rl_cfg(**kw):
  base = dict(
    mask_token_id=M,
    pad_token_id=0,
    max_new_tokens=7,
    greedy=False,
    temperature=0.7,
    window=4,
    stop_at_eos=False,
    rollout_stats=True,
  )
  flags = {k: kw.pop(k) for k in ("policy", "policy_arg", "threshold") if k in kw}
  base.update(kw, policy=commit_policy(**flags))  # the launchers' flags, as the RL loop's
  return SamplerConfig(**base)


def score(method, out, cfg, model, params, rows=False):
  """The scorer's rows, or its log-probs with the head 3 positions at a time (the RL path)."""
  fn = scoring.token_logits if rows else functools.partial(scoring.token_logprobs, chunk=3)
  jitted = jax.jit(
    fn,
    static_argnums=(0, 1),
    static_argnames=("temperature", "mask_token_id", "block_size", "max_steps"),
  )
  return np.asarray(
    jitted(
      method,
      model,
      params,
      scoring.rollout_from_output(out),
      temperature=cfg.temperature,
      mask_token_id=cfg.mask_token_id,
      block_size=cfg.block_size,
    )
  )


# ------------------------------------------------------------------------------ scorer == sampler
CASES = {
  "setdlm_pmax": ("setdlm", set_generate, dict(policy="pmax", policy_arg=0.3)),
  "setdlm_topk_fht": (  # fht's reveal schedule spans the model's context: max_length is needed
    "setdlm",
    set_generate,
    dict(policy="topk", policy_arg=2, cache_order="fht", max_length=16),
  ),
  "ar": ("ar", ar_generate, {}),
  "bd3lm_topk": ("bd3lm", bd3lm_generate, dict(policy="topk", policy_arg=2, block_size=4)),
  "bd3lm_aligned": (
    "bd3lm",
    bd3lm_generate,
    dict(policy="pmax", policy_arg=0.3, block_size=4, align_to_blocks=True),
  ),
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
  np.testing.assert_allclose(
    np.take_along_axis(rows, out.canvas[..., None], -1)[..., 0], lp, atol=1e-6
  )
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
      clean_tok[i, : len(seen)] = r.tokens[i, seen]
      clean_pos[i, : len(seen)] = seen
      clean_ok[i, : len(seen)] = True
      now = np.nonzero(r.commit_step[i] == t)[0]
      act_pos[i, : len(now)] = now
      act_ok[i, : len(now)] = True
    tokens = np.concatenate([clean_tok, np.full((b, lc), M, np.int32)], -1)
    mask = masks.cached_step_mask(jnp.zeros((b, 0), bool), clean_ok, act_ok)
    logits, _ = apply(
      params,
      jnp.asarray(tokens),
      jnp.asarray(np.concatenate([clean_pos, act_pos], -1)),
      mask,
      None,
      lc,
    )
    want = jax.nn.log_softmax(suppress_mask_logit(logits, M) / cfg.temperature, -1)
    got = np.take_along_axis(rows, act_pos[..., None], 1)
    np.testing.assert_allclose(got[act_ok], np.asarray(want)[act_ok], atol=2e-5)
    checked += act_ok.sum()
  assert checked == 3 * 7


def test_bd3lm_scorer_equals_a_dense_two_stream_recomputation():
  """BD3LM (block-aligned prompts, S = 4, two commits per step): each step recomputed as one
  uncached training-layout forward [x, x_t] with the block-causal mask, where x and x_t are the
  canvas before the step (tokens committed at earlier steps, M elsewhere); the scorer's rows at the
  positions committed in that step must be those logits' distributions."""
  model, params = tiny(16)
  cfg = rl_cfg(**CASES["bd3lm_topk"][2])  # the sampler compiled above
  prompts = [[1, 5, 6, 7], [1, 9, 4, 6]]  # block-aligned: the grid is the training layout's
  out = bd3lm_generate(model, params, prompts, cfg.replace(max_new_tokens=8), jax.random.key(5))
  rows = score("bd3lm", out, cfg, model, params, rows=True)
  r = scoring.rollout_from_output(out)
  apply = backbone_apply_fn(model.config)
  b, lc = r.tokens.shape
  mask = jnp.asarray(masks.block_causal_mask(lc, 4))[None].repeat(b, 0)
  positions = jnp.asarray(np.tile(np.arange(2 * lc) % lc, (b, 1)), jnp.int32)
  tokens, steps = np.asarray(r.tokens), np.asarray(r.commit_step)
  checked = 0
  for t in range(int(out.num_steps.max())):
    canvas = np.where(np.asarray(r.context) | ((steps >= 0) & (steps < t)), tokens, M)
    x = jnp.asarray(np.concatenate([canvas, canvas], -1), jnp.int32)
    logits, _ = apply(params, x, positions, mask, None, lc)
    want = np.asarray(jax.nn.log_softmax(suppress_mask_logit(logits, M) / cfg.temperature, -1))
    now = steps == t
    np.testing.assert_allclose(rows[now], want[now], atol=2e-5)
    checked += now.sum()
  assert checked == 2 * 8 and (np.bincount(steps[steps >= 0]) == 2 * 2).all()


def test_scorer_is_jittable_and_differentiable():
  model, params = tiny(16)
  cfg = rl_cfg(**CASES["setdlm_pmax"][2])  # the sampler compiled above
  out = set_generate(model, params, PROMPTS, cfg, jax.random.PRNGKey(0))
  r = scoring.rollout_from_output(out)

  def total(p):
    return jnp.sum(
      scoring.token_logprobs("setdlm", model, p, r, temperature=cfg.temperature, mask_token_id=M)
    )

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
      stats = StepStats(
        cand=jnp.array([[a, b]]),
        conf=jnp.array([[a_dist[a], b_dist[b]]]),
        pmax=jnp.array([[max(a_dist), max(b_dist)]]),
        margin=jnp.zeros((1, 2)),
        entropy=jnp.zeros((1, 2)),
        argmax=jnp.zeros((1, 2), jnp.int32),
        streak=jnp.ones((1, 2), jnp.int32),
      )
      keep = np.asarray(
        policies.commit(rule, None, stats, jnp.ones((1, 2), bool), jnp.ones((1,), jnp.int32))
      )[0]
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
  _, first, inv, counts = np.unique(
    keys, axis=0, return_index=True, return_inverse=True, return_counts=True
  )
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
  lp = scoring.token_logprobs(
    method, model, params, distinct, temperature=cfg.temperature, mask_token_id=M
  )
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
  base = dict(
    mask_token_id=M,
    pad_token_id=0,
    max_new_tokens=3,
    greedy=False,
    window=3,
    stop_at_eos=False,
    temperature=1.5,
    rollout_stats=True,
  )
  rows = 100_000
  exact = {
    "setdlm pmax": (
      "setdlm",
      set_generate,
      SamplerConfig(**base, policy=CommitPolicy("pmax", 0.77)),
    ),
    "setdlm topk": ("setdlm", set_generate, SamplerConfig(**base, policy=CommitPolicy("topk", 2))),
    "ar": ("ar", ar_generate, SamplerConfig(**base)),
  }
  for name, (method, gen, cfg) in exact.items():
    stats, parallel, keys = monte_carlo(method, gen, cfg, rows)
    for stat, df, q, total in stats:
      assert stat < q, (name, stat, df, q)
      assert total == pytest.approx(1.0, abs=1e-3), name  # all trajectories were observed
      assert df >= 15, name
    if name == "setdlm topk":
      assert parallel == 1.5  # 2 + 1 commits on every row
    if name == "setdlm pmax":
      steps = keys[:, keys.shape[1] // 2 :]
      per_step = [np.bincount(s[s >= 0]).max() for s in steps[::2][:2000]]
      assert 1.0 < parallel < 3.0 and max(per_step) == 2 and min(per_step) == 1
  cfg = SamplerConfig(**base, policy=CommitPolicy("threshold", 0.77))
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


@pytest.mark.parametrize(
  "kw, method, expect",
  [
    (dict(policy="threshold", threshold=0.9), "setdlm", "--policy=threshold .*--policy=pmax"),
    (dict(policy="threshold"), "bd3lm", "--policy=threshold .*--policy=pmax"),
    (dict(policy="pmax", top_p=0.9), "setdlm", "top_p=0.9: .*use top_p=1.0"),
    (
      dict(policy="pmax", repetition_penalty=1.2),
      "setdlm",
      "repetition_penalty=1.2: .*use repetition_penalty=1.0",
    ),
    (dict(policy="pmax", greedy=True), "setdlm", "greedy=True: .*greedy=False"),
    (dict(top_p=0.95), "ar", "top_p=0.95"),
    (dict(policy="pmax"), "mdlm", "objective=mdlm: .*supports setdlm, ar, bd3lm"),
  ],
)
def test_inexact_settings_are_one_error_line(kw, method, expect):
  import re

  line = error_line(lambda: scoring.check_exact(method, rl_cfg(**kw)))
  assert re.search(expect, line), line


def test_exact_settings_pass_and_mdlm_output_is_refused():
  scoring.check_exact("ar", rl_cfg())  # AR has no commit policy: threshold is irrelevant
  for name, p in policies.POLICIES.items():
    if not p.token_dependent:
      scoring.check_exact("setdlm", rl_cfg(policy=name))
  out = SampleOutput(
    sequences=[[1]],
    generated=[[]],
    canvas=np.zeros((1, 2), np.int32),
    target=np.zeros((1, 2), bool),
    commit_step=np.full((1, 2), -1),
    num_steps=np.zeros(1),
    forward_calls=np.zeros(1),
    num_committed=np.zeros(1),
    stopped=np.zeros(1, bool),
  )
  assert "MDLM has no cache" in error_line(lambda: scoring.rollout_from_output(out))


# ------------------------------------------------------------------- chunked head == full rows
def test_head_scores_chunks_against_numpy():
  """head_scores on given logits (a logits function's features: the head is the identity), at
  chunks 1, 5 (does not divide L = 12), 12 and None, against float64 NumPy: log-probs of the
  tokens and the exact KL at temperature 0.7 with M suppressed; zeros where not generated; and
  the gradient in the features equal across chunkings."""
  rng = np.random.default_rng(4)
  b, length, v, temp = 2, 12, 9, 0.7
  z, zr = rng.normal(size=(2, b, length, v)).astype(np.float32) * 3
  tokens = rng.integers(4, v, (b, length)).astype(np.int32)
  gen = rng.random((b, length)) < 0.7
  r = scoring.Rollout(
    tokens=tokens,
    valid=np.ones_like(gen),
    context=~gen,
    generated=gen,
    commit_step=np.where(gen, 0, -1),
    cache_order=np.zeros_like(tokens),
  )
  logits_fn = lambda *a: None  # never run: only its head (the identity) is used

  def lsm(x):
    x = np.where(np.arange(v) == M, -np.inf, x.astype(np.float64) / temp)
    return (
      x
      - np.log(np.sum(np.exp(x - x.max(-1, keepdims=True)), -1, keepdims=True))
      - x.max(-1, keepdims=True)
    )

  lq, lr = lsm(z), lsm(zr)
  want_lp = np.where(gen, np.take_along_axis(lq, tokens[..., None], -1)[..., 0], 0.0)
  keep = np.arange(v) != M  # the suppressed token: probability 0 under both
  q = np.exp(lq[..., keep])
  want_kl = np.where(gen, np.sum(q * (lq[..., keep] - lr[..., keep]), -1), 0.0)
  grads = []
  for chunk in (1, 5, None):

    def f(feats, chunk=chunk):
      return scoring.head_scores(
        logits_fn,
        None,
        feats,
        r,
        temperature=temp,
        mask_token_id=M,
        chunk=chunk,
        ref_params=(),
        ref_feats=jnp.asarray(zr),
      )

    lp, kl = jax.jit(f)(jnp.asarray(z))
    np.testing.assert_allclose(np.asarray(lp), want_lp, atol=1e-5, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(kl), want_kl, atol=1e-5, rtol=1e-5)
    grad = jax.jit(jax.grad(lambda x, f=f: sum(jnp.sum(s) for s in f(x))))
    grads.append(np.asarray(grad(jnp.asarray(z))))
  assert np.abs(grads[0]).max() > 1e-2
  for g in grads[1:]:
    np.testing.assert_allclose(g, grads[0], atol=1e-6)


def hand_rollout(method: str, rng, b=2, length=12, prompt=4, vocab=16):
  """A trajectory by hand (no sampler): AR one token per step in position order; SetDLM sets at
  drawn steps, cached in (step, position) order; BD3LM two blocks of 4 after a 4-token prompt,
  each decoded in two steps (steps continue across blocks)."""
  tokens = rng.integers(4, vocab, (b, length)).astype(np.int32)  # never M = 3
  pos = np.arange(length)
  context = np.broadcast_to(pos < prompt, (b, length))
  if method == "ar":
    steps = np.broadcast_to(np.where(context[0], -1, pos - prompt), (b, length))
    order = np.broadcast_to(pos, (b, length))
  elif method == "setdlm":
    steps = np.sort(rng.integers(0, 4, (b, length - prompt)), 1)
    steps = np.concatenate([np.full((b, prompt), -1), steps - steps[:, :1]], 1)
    order = np.stack([np.argsort(np.lexsort((pos, s))) for s in steps])
  else:
    steps = np.broadcast_to([-1] * 4 + [0, 1, 0, 1] + [3, 2, 2, 3], (b, length))
    order = np.broadcast_to(pos // 4, (b, length))
  return scoring.Rollout(
    tokens=tokens,
    valid=np.ones((b, length), bool),
    context=context,
    generated=~context,
    commit_step=np.asarray(steps, np.int32),
    cache_order=np.asarray(order, np.int32),
  )


def full_scores(method, model, params, ref_params, r, temperature):
  """The unchunked reference through the logits path (a `Forward`: no hidden states): fp32
  [B, L] log-probs and KL from the full [B, L, V] rows."""
  fwd = Forward(backbone_apply_fn(model.config))
  kw = dict(temperature=temperature, mask_token_id=M, block_size=4)
  rows = scoring.token_logits(method, fwd, params, r, **kw)
  ref = scoring.token_logits(method, fwd, ref_params, r, **kw)
  lp = jnp.take_along_axis(rows, jnp.asarray(r.tokens)[..., None], -1)[..., 0]
  return lp, jnp.where(jnp.asarray(r.generated), objective.kl_per_token(rows, ref), 0.0)


def chunked_scores(method, model, params, ref_params, r, temperature, chunk):
  kw = dict(mask_token_id=M, block_size=4)
  feats = scoring.token_features(method, model, params, r, **kw)
  ref_feats = scoring.token_features(method, model, ref_params, r, **kw)
  return scoring.head_scores(
    model,
    params,
    feats,
    r,
    temperature=temperature,
    mask_token_id=M,
    chunk=chunk,
    ref_params=ref_params,
    ref_feats=ref_feats,
  )


def tiny_qwen3(seed: int):
  cfg = Qwen3Config(
    vocab_size=16,
    hidden_size=32,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=48,
    dropout=0.0,
  )
  return Qwen3(cfg), random_params(cfg, seed)


@pytest.mark.slow
@pytest.mark.parametrize(
  "method,backbone", [("setdlm", "dit"), ("ar", "dit"), ("bd3lm", "dit"), ("setdlm", "qwen3")]
)
def test_chunked_logprobs_kl_and_gradients_equal_the_full_rows(method, backbone):
  """head_scores at chunk 5 (does not divide L = 12) and chunk None against the full fp32
  [B, L, V] rows of the logits path: values, and jax.grad of a weighted sum of both."""
  build = tiny if backbone == "dit" else lambda v, seed=0: tiny_qwen3(seed)
  model, params = build(16)
  _, ref_params = build(16, seed=1)
  rng = np.random.default_rng(0)
  r = hand_rollout(method, rng)
  w = jnp.asarray(rng.normal(size=r.tokens.shape), jnp.float32)

  def full(p):
    return full_scores(method, model, p, ref_params, r, 0.7)

  def chunked(p, chunk=5):
    return chunked_scores(method, model, p, ref_params, r, 0.7, chunk)

  def weighted(scores):
    return lambda p: sum(jnp.sum(w * s) for s in scores(p))

  lp_full, kl_full = jax.jit(full)(params)
  assert np.all(np.asarray(lp_full)[r.generated] < 0)  # not a comparison between zeros
  assert np.all(np.asarray(kl_full)[r.generated] > 0)
  # <= 1e-6 (1 + |x|): a few fp32 ulps of values up to ~7 (hidden states + head vs logits)
  for lp, kl in (jax.jit(chunked)(params), chunked(params, None)):
    np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_full), atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(kl), np.asarray(kl_full), atol=1e-6, rtol=1e-6)
  g_full = jax.tree_util.tree_leaves(jax.jit(jax.grad(weighted(full)))(params))
  g_chunk = jax.tree_util.tree_leaves(jax.jit(jax.grad(weighted(chunked)))(params))
  scale = max(float(jnp.max(jnp.abs(a))) for a in g_full)
  assert scale > 1e-3
  err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(g_full, g_chunk))
  assert err <= 1e-6 * scale, (err, scale)  # fp32 summation-order noise only


def _temp_bytes(fn, *args):
  analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
  if analysis is None:
    pytest.skip("this backend reports no compiled memory analysis")
  return int(analysis.temp_size_in_bytes)


@pytest.mark.slow
def test_chunked_scorer_needs_less_memory_at_a_large_vocabulary(capsys):
  """The compiled temp memory of value-and-grad of (log-probs + KL) at V = 32,768: the head in
  chunks of 8 positions against the full [B, L, V] rows (B = 2, L = 64, D = 32)."""
  cfg = DiTConfig(vocab_size=32768, hidden_size=32, num_layers=1, num_heads=2, dropout=0.0)
  model, params = random_dit(cfg, 0)
  _, ref_params = random_dit(cfg, 1)
  r = hand_rollout("setdlm", np.random.default_rng(0), length=64, prompt=8, vocab=32768)

  def loss(scores):
    return jax.value_and_grad(lambda p: sum(jnp.sum(s) for s in scores(p)))

  full = _temp_bytes(loss(lambda p: full_scores("setdlm", model, p, ref_params, r, 0.7)), params)
  chunked = _temp_bytes(
    loss(lambda p: chunked_scores("setdlm", model, p, ref_params, r, 0.7, 8)), params
  )
  with capsys.disabled():
    print(
      f"\nRL scorer temp memory, V=32768 B=2 L=64: full {full / 2**20:.1f} MiB, "
      f"chunk 8 {chunked / 2**20:.1f} MiB"
    )
  assert chunked < full
