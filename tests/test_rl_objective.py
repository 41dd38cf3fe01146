"""The GRPO pieces that need no sampler (`setdiff_jax/rl/objective.py`, `rl/rewards.py`).

Checked against hand-worked examples and independent NumPy recomputations: group advantages, the
clipped surrogate and its clip fraction, the exact KL, that a group with equal rewards contributes
exactly zero gradient, the loss gradient through the exact SetDLM scorer of a tiny model
against central differences, and the RL run's update function (`grpo.make_functions`) against the
optimizer applied to the gradient of the loss written from the full scorer rows.
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import random_dit
from setdiff_jax import train_step
from setdiff_jax.config.sections import Optimization
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.rl import grpo, objective, rewards, scoring
from setdiff_jax.sampling import SamplerConfig

pytestmark = pytest.mark.usefixtures("fast_compile")


# ----------------------------------------------------------------------------- advantages
def test_group_advantages_zero_mean_unit_std_and_equal_groups_zero():
  r = np.array([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 0.3, 0.3, 2.0, -1.0, 0.5, 0.5], np.float32)
  adv = np.asarray(objective.group_advantages(r, 4, eps=1e-6))
  g = r.reshape(3, 4).astype(np.float64)
  want = (g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-6)
  want[1] = 0.0
  np.testing.assert_allclose(adv.reshape(3, 4), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv.reshape(3, 4).mean(1), 0.0, atol=1e-6)
  assert np.all(adv[4:8] == 0.0)  # exactly: 0.3 - mean(0.3 x 4) need not round to 0
  # hand-worked: rewards (1, 0, 0, 1): mean 0.5, std 0.5 -> +-1 / (1 + 2 eps)
  np.testing.assert_allclose(adv[:4], np.array([1, -1, -1, 1]) * 0.5 / (0.5 + 1e-6), rtol=1e-6)
  with pytest.raises(ValueError, match="groups of 4"):
    objective.group_advantages(np.zeros(6), 4)


# ----------------------------------------------------------------------------- clipped objective
def _hand_example():
  # row 0: A = +1, ratios 1.5 (clipped to 1.2: active) and 0.5 (unclipped term is smaller);
  # row 1: A = -1, ratios 0.5 (clipped to 0.8: -0.8 < -0.5, active) and 1.1 (inside the range).
  # The last position of each row is not generated (mask 0) and carries a wild ratio.
  ratios = np.array([[1.5, 0.5, 9.0], [0.5, 1.1, 0.01]])
  old = np.array([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]], np.float32)
  logp = (old + np.log(ratios)).astype(np.float32)
  adv = np.array([1.0, -1.0], np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 0]], bool)
  return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask)


def test_clipped_objective_hand_worked():
  logp, old, adv, mask = _hand_example()
  loss, m = objective.clipped_objective(logp, old, adv, mask, clip_eps=0.2)
  # terms: min(1.5, 1.2) = 1.2; min(0.5, 0.8) = 0.5; min(-0.5, -0.8) = -0.8; -1.1
  np.testing.assert_allclose(float(loss), -(1.2 + 0.5 - 0.8 - 1.1) / 4, rtol=1e-5)
  np.testing.assert_allclose(float(m["clip_fraction"]), 0.5, rtol=1e-6)  # tokens 1 and 3
  grad = np.asarray(
    jax.grad(lambda lp: objective.clipped_objective(lp, old, adv, mask, clip_eps=0.2)[0])(logp)
  )
  # d/dlogp of -term/4: clipped tokens 0; others -ratio * A / 4; not generated 0
  np.testing.assert_allclose(grad, [[0.0, -0.5 / 4, 0.0], [0.0, 1.1 / 4, 0.0]], atol=1e-6)


def test_equal_reward_group_contributes_exactly_zero_gradient():
  rng = np.random.default_rng(0)
  r = np.array([1.0, 0.0, 1.0, 0.5, 0.5, 0.5], np.float32)  # group 2 (rows 3-5) all equal
  adv = objective.group_advantages(r, 3)
  logp = jnp.asarray(rng.normal(size=(6, 5)) - 2.0, jnp.float32)
  old = logp + jnp.asarray(0.3 * rng.normal(size=(6, 5)), jnp.float32)
  mask = jnp.asarray(rng.random((6, 5)) < 0.8)
  grad = np.asarray(
    jax.grad(lambda lp: objective.grpo_loss(lp, old, adv, mask, clip_eps=0.2)[0])(logp)
  )
  assert np.all(grad[3:] == 0.0)
  assert np.any(grad[:3] != 0.0)  # the other group does move the policy


# ----------------------------------------------------------------------------- exact KL
def test_exact_kl_matches_numpy_and_is_zero_for_the_same_policy():
  rng = np.random.default_rng(1)
  z, zr = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
  z[..., 0] = -1e12  # a suppressed token: probability 0 under both
  zr[..., 0] = -1e12
  lq = jax.nn.log_softmax(jnp.asarray(z, jnp.float32), -1)
  lr = jax.nn.log_softmax(jnp.asarray(zr, jnp.float32), -1)
  mask = jnp.asarray([[1, 1, 0], [0, 1, 1]], bool)
  q, p = np.exp(np.asarray(lq, np.float64)), np.exp(np.asarray(lr, np.float64))
  per = np.sum(q[..., 1:] * np.log(q[..., 1:] / p[..., 1:]), -1)
  want = per[np.asarray(mask)].mean()
  np.testing.assert_allclose(float(objective.exact_kl(lq, lr, mask)), want, rtol=1e-5)
  assert abs(float(objective.exact_kl(lq, lq, mask))) < 1e-7
  loss, m = objective.grpo_loss(
    jnp.zeros((2, 3)),
    jnp.zeros((2, 3)),
    jnp.zeros(2),
    mask,
    clip_eps=0.2,
    beta=0.5,
    kl=objective.kl_per_token(lq, lr),
  )
  np.testing.assert_allclose(float(loss), 0.5 * want, rtol=1e-5)  # A = 0: only the KL remains
  np.testing.assert_allclose(float(m["kl"]), want, rtol=1e-5)


# ----------------------------------------------------------------------------- gradient check
M = 10  # the mask token of the gradient check's vocabulary of 11


def _set_rollout(rng, b=4, length=8, prompt=2):
  """A SetDLM trajectory by hand: a 2-token prompt, then the 6 generated positions committed in
  sets at steps drawn per row (0, 0, 1, ...), cached after the prompt in (step, position) order."""
  tokens = rng.integers(0, M, (b, length))
  steps = np.sort(rng.integers(0, 4, (b, length - prompt)), 1)
  steps = np.concatenate([np.full((b, prompt), -1), steps - steps[:, :1]], 1)
  order = np.zeros((b, length), np.int64)
  for i in range(b):
    rank = np.lexsort((np.arange(length), steps[i]))  # context (-1) first, then by step
    order[i, rank] = np.arange(length)
  context = np.arange(length)[None] < prompt
  return scoring.Rollout(
    tokens=jnp.asarray(tokens, jnp.int32),
    valid=jnp.ones((b, length), bool),
    context=jnp.asarray(np.broadcast_to(context, (b, length))),
    generated=jnp.asarray(np.broadcast_to(~context, (b, length))),
    commit_step=jnp.asarray(steps, jnp.int32),
    cache_order=jnp.asarray(order, jnp.int32),
  )


def _policies_and_rollout(model_seed: int, rng_seed: int):
  """A random tiny DiT (V = 11) and a reference one (the next seed), a hand SetDLM rollout, and
  two functions: the full scorer rows [B, L, V] of some parameters at temperature 0.7, and the
  taken tokens' entries [B, L] of such rows."""
  cfg = DiTConfig(
    vocab_size=11, hidden_size=32, num_layers=1, num_heads=2, dropout=0.0, head_vocab_chunk=0
  )
  model, params = random_dit(cfg, model_seed)
  _, ref_params = random_dit(cfg, model_seed + 1)
  rng = np.random.default_rng(rng_seed)
  rollout = _set_rollout(rng)

  def rows_of(p):
    return scoring.token_logits("setdlm", model, p, rollout, temperature=0.7, mask_token_id=M)

  def take(rows):
    return jnp.take_along_axis(rows, rollout.tokens[..., None], -1)[..., 0]

  return model, params, ref_params, rng, rollout, rows_of, take


@pytest.mark.slow
def test_loss_gradient_matches_central_differences():
  """jax.grad of the GRPO loss (clipped surrogate + beta * exact KL) through the exact SetDLM
  scorer against central differences on the 8 steepest coordinates of the 4 steepest leaves."""
  model, params, ref_params, rng, rollout, rows_of, take = _policies_and_rollout(3, 2)
  mask = rollout.generated
  adv = objective.group_advantages(jnp.asarray([1.0, 0.0, 0.2, 0.9]), 2)
  # log-ratios of +-0.03 (inside the clip range of eps = 0.1) or +-0.3 (outside): every ratio
  # stays far from the kinks at 1 +- eps under the small moves of the differences.
  shift = rng.choice([-0.3, -0.03, 0.03, 0.3], size=mask.shape)
  old = take(rows_of(params)) + jnp.asarray(shift, jnp.float32)
  ref_rows = rows_of(ref_params)

  kw = dict(mask_token_id=M)
  ref_feats = scoring.token_features("setdlm", model, ref_params, rollout, **kw)
  np.testing.assert_allclose(  # the chunked reference head == the full rows
    np.asarray(
      scoring.head_scores(
        model,
        params,
        scoring.token_features("setdlm", model, params, rollout, **kw),
        rollout,
        temperature=0.7,
        chunk=3,
        ref_params=ref_params,
        ref_feats=ref_feats,
        **kw,
      )[1]
    ),
    np.asarray(jnp.where(mask, objective.kl_per_token(rows_of(params), ref_rows), 0.0)),
    atol=1e-6,
  )

  def loss_fn(p):  # the RL update's path: the head 3 positions at a time (3 does not divide 8)
    feats = scoring.token_features("setdlm", model, p, rollout, **kw)
    logp, kl = scoring.head_scores(
      model,
      p,
      feats,
      rollout,
      temperature=0.7,
      chunk=3,
      ref_params=ref_params,
      ref_feats=ref_feats,
      **kw,
    )
    return objective.grpo_loss(logp, old, adv, mask, clip_eps=0.1, beta=0.3, kl=kl)[0]

  loss, grad = jax.jit(jax.value_and_grad(loss_fn))(params)
  clip = objective.clipped_objective(take(rows_of(params)), old, adv, mask, 0.1)[1]
  assert 0.0 < float(clip["clip_fraction"]) < 1.0  # both branches of the min are exercised
  leaves, tree = jax.tree_util.tree_flatten(jax.tree_util.tree_map(np.asarray, params))
  gleaves = jax.tree_util.tree_leaves(grad)
  f = jax.jit(loss_fn)
  checked = 0
  for li in np.argsort([-float(jnp.max(jnp.abs(g))) for g in gleaves])[:4]:  # the steepest leaves
    g = np.asarray(gleaves[li]).reshape(-1)
    for idx in np.argsort(-np.abs(g))[:2]:
      h = 1e-3 * max(1.0, abs(float(leaves[li].reshape(-1)[idx])))
      vals = []
      for sign in (1.0, -1.0):
        moved = leaves[li].copy().reshape(-1)
        moved[idx] += np.float32(sign * h)
        moved = moved.reshape(leaves[li].shape)
        vals.append(
          float(f(jax.tree_util.tree_unflatten(tree, leaves[:li] + [moved] + leaves[li + 1 :])))
        )
      fd = (vals[0] - vals[1]) / (2 * h)
      np.testing.assert_allclose(fd, g[idx], rtol=5e-2, atol=2e-4 * max(1.0, abs(float(loss))))
      checked += 1
  assert checked == 8


def test_rl_update_is_the_optimizer_on_the_full_row_loss_gradient():
  """grpo.make_functions' `update` (features, then the head 3 positions at a time, then the
  optimizer) equals the optimizer applied to the gradient of the GRPO loss written from the full
  scorer rows (`scoring.token_logits`: one forward, every position's distribution), and its
  `score` equals those rows' log-probabilities of the taken tokens."""
  model, params, ref_params, rng, rollout, rows_of, take = _policies_and_rollout(5, 7)
  run = SimpleNamespace(rl=SimpleNamespace(kl_beta=0.2, clip_eps=0.1, score_chunk=3))
  sampler_cfg = SamplerConfig(
    mask_token_id=M, eos_token_id=0, pad_token_id=0, bos_token_id=0, temperature=0.7, greedy=False
  )
  tx = train_step.make_optimizer(
    Optimization(learning_rate=1e-2, warmup_steps=0, weight_decay=0.05, grad_clip_norm=0.5)
  )
  score, ref_features, update = grpo.make_functions(run, "setdlm", model, tx, sampler_cfg)
  mask = rollout.generated
  np.testing.assert_allclose(
    np.where(mask, np.asarray(score(params, rollout)), 0.0),
    np.where(mask, np.asarray(take(rows_of(params))), 0.0),
    atol=1e-5,
  )
  adv = objective.group_advantages(jnp.asarray([1.0, 0.0, 0.2, 0.9]), 2)
  old = take(rows_of(params)) + jnp.asarray(rng.choice([-0.3, 0.03], size=mask.shape), jnp.float32)
  ref_rows = rows_of(ref_params)

  def full_loss(p):
    rows = rows_of(p)
    kl = jnp.where(mask, objective.kl_per_token(rows, ref_rows), 0.0)
    return objective.grpo_loss(take(rows), old, adv, mask, clip_eps=0.1, beta=0.2, kl=kl)[0]

  loss, grads = jax.value_and_grad(full_loss)(params)
  opt_state = tx.init(params)
  want_updates, _ = tx.update(grads, opt_state, params)
  want = optax.apply_updates(params, want_updates)
  got, _, metrics = update(
    params, opt_state, rollout, adv, old, ref_features(ref_params, rollout), ref_params
  )
  np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["grad_norm"]), float(optax.tree.norm(grads)), rtol=1e-4)
  assert float(optax.tree.norm(grads)) > 0.5  # the clip is active
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  # Adam's first step reads little more than the gradient's signs: plain SGD shows all of it
  sgd = optax.sgd(1.0)
  update_sgd = grpo.make_functions(run, "setdlm", model, sgd, sampler_cfg)[2]
  moved, _, _ = update_sgd(
    params, sgd.init(params), rollout, adv, old, ref_features(ref_params, rollout), ref_params
  )
  for p0, p1, g in zip(*(jax.tree_util.tree_leaves(t) for t in (params, moved, grads))):
    np.testing.assert_allclose(np.asarray(p0) - np.asarray(p1), np.asarray(g), atol=1e-5)


# ----------------------------------------------------------------------------- rewards
def test_rewards_by_name_step_cost_and_unknown_name():
  ref = "7+5=12\n12-3=9\n#### 9"
  texts = [
    "7+5=12\n12-3=9\n#### 9",
    "7+5=12\n12-3=8\n#### 8",
    "no answer",
    "#### 9\n#### 9",
    "#### nine",
  ]
  np.testing.assert_array_equal(
    rewards.compute("exact_match", texts, [ref] * 5, [0] * 5), [1, 0, 0, 1, 0]
  )
  np.testing.assert_array_equal(
    rewards.compute("format", texts, [ref] * 5, [0] * 5), [1, 1, 0, 0, 0]
  )
  np.testing.assert_allclose(
    rewards.compute("exact_match+format", texts, [ref] * 5, [4, 2, 10, 1, 0], step_cost=0.1),
    [2 - 0.4, 1 - 0.2, -1.0, 1 - 0.1, 0.0],
    rtol=1e-6,
  )
  with pytest.raises(ValueError) as e:
    rewards.get("exact")
  assert "rl.reward='exact'" in str(e.value) and "exact_match, format" in str(e.value)
  # Non-ASCII digits are no number for either reward (probe round 12: format paid 1 for an
  # answer exact_match can never accept); ASCII ones are.
  odd = ["#### \uff15", "#### \u0665", "#### \uff15.\uff10", "#### 5"]
  np.testing.assert_array_equal(
    rewards.compute("format", odd, ["#### 5"] * 4, [0] * 4), [0, 0, 0, 1]
  )
  np.testing.assert_array_equal(
    rewards.compute("exact_match", odd, ["#### 5"] * 4, [0] * 4), [0, 0, 0, 1]
  )
