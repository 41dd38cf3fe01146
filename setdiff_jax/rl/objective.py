"""The GRPO objective as pure functions: group advantages, the clipped policy-gradient loss and
the exact KL to a reference, on the scorer's per-token log-probabilities (`rl.scoring`).

  adv = group_advantages(rewards, group_size)                       # fp32 [B], B = P * G
  loss, m = grpo_loss(logp, old_logp, adv, mask, clip_eps=0.2)      # logp: fp32 [B, L]
  loss, m = grpo_loss(..., beta=0.04, kl=kl)       # + beta * KL; kl fp32 [B, L] per position
                                                   # (`scoring.head_scores`, chunked);
                                                   # m["kl"] only then (never a stand-in 0)

Rows are P groups of G consecutive completions of one prompt. `old_logp` (pi_old) is the scorer's
value under the parameters that sampled the rollouts, computed once before the inner updates and
held fixed: never the sampler's own numbers, so a sampler in another dtype cannot make the ratio
differ from 1 on the first update. Everything here is jittable and differentiable in `logp` /
`log_probs`.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np


def group_advantages(rewards: jax.Array, group_size: int, eps: float = 1e-6) -> jax.Array:
  """(r - mean_g) / (std_g + eps) per group of `group_size` consecutive rows, fp32 [B].

  rewards: [B], B a multiple of `group_size` (a static int >= 1). std is the population standard
  deviation of the group. A group whose rewards are all equal gets advantage exactly 0 (not the
  rounding residue of r - mean), so it contributes no gradient. Concrete rewards must be finite
  (one NaN would turn its whole group's advantages NaN); traced ones are not checked.
  """
  if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
    raise ValueError(f"group_size={group_size!r} must be an int >= 1 (completions per prompt)")
  if group_size < 1:
    raise ValueError(f"group_size={group_size} must be >= 1 (completions per prompt)")
  r = jnp.asarray(rewards, jnp.float32)
  if r.ndim != 1:
    raise ValueError(f"rewards has shape {list(r.shape)}: one reward per row, shape [B]")
  if r.shape[0] % group_size:
    raise ValueError(f"{r.shape[0]} rewards do not split into groups of {group_size}")
  if not isinstance(r, jax.core.Tracer):  # inside jit the values are unknown until run time
    bad = np.flatnonzero(~np.isfinite(np.asarray(r)))
    if bad.size:
      raise ValueError(
        f"reward {float(r[bad[0]])} at row {int(bad[0])} is not finite ({bad.size} such rows): "
        f"group advantages need finite rewards; check the reward function (rl.reward)"
      )
  g = r.reshape(-1, group_size)
  mean = jnp.mean(g, 1, keepdims=True)
  std = jnp.std(g, 1, keepdims=True)
  adv = (g - mean) / (std + eps)
  equal = (jnp.max(g, 1) == jnp.min(g, 1))[:, None]
  return jnp.where(equal, 0.0, adv).reshape(-1)


def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of x [B, L] over the positions with mask [B, L] (0 when there are none)."""
  m = mask.astype(jnp.float32)
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


def clipped_objective(
  logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, clip_eps: float
) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """The PPO / GRPO clipped surrogate as a loss to minimise, with token-level averaging.

  Per generated token (mask [B, L]) of row b: ratio = exp(logp - old_logp) and
  term = min(ratio * A_b, clip(ratio, 1 - eps, 1 + eps) * A_b). The loss is minus the mean of
  `term` over every generated token of the batch (each token weighs the same, so a longer
  completion weighs more; not a mean of per-row means). Returns (loss, metrics) with
  clip_fraction: the share of generated tokens whose gradient the clip removed (the clipped term is
  the smaller one), and ratio_mean.
  """
  ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
  a = advantages[:, None].astype(jnp.float32)
  unclipped = ratio * a
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
  term = jnp.minimum(unclipped, clipped)
  loss = -token_mean(term, mask)
  metrics = {
    "clip_fraction": token_mean((clipped < unclipped).astype(jnp.float32), mask),
    "ratio_mean": token_mean(ratio, mask),
  }
  return loss, metrics


def kl_per_token(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
  """KL(pi || pi_ref) = sum_v pi_v (log pi_v - log ref_v) over the last axis of log-softmax rows
  [..., V] (fp32) -> [...]. Entries with pi_v = 0 (e.g. the suppressed mask token) contribute 0.
  The scorer applies it chunk by chunk (`scoring.head_scores`)."""
  p = jnp.exp(log_probs)
  diff = jnp.where(p > 0, log_probs - ref_log_probs, 0.0)
  return jnp.sum(p * diff, -1)


def exact_kl(log_probs: jax.Array, ref_log_probs: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean over generated positions (mask [B, L]) of `kl_per_token` of full rows [B, L, V]."""
  return token_mean(kl_per_token(log_probs, ref_log_probs), mask)


def grpo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_eps: float,
  beta: float = 0.0,
  kl: Optional[jax.Array] = None,
) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """clipped_objective + beta * (the mean over generated positions of `kl`: fp32 [B, L], the
  exact per-position KL(pi || pi_ref) of the same positions as logp, `scoring.head_scores` or
  `kl_per_token`). Returns (loss, metrics: policy_loss, clip_fraction, ratio_mean, and kl only
  when `kl` is given: a KL that was not measured is left out, never reported as 0)."""
  policy, metrics = clipped_objective(logp, old_logp, advantages, mask, clip_eps)
  metrics = dict(metrics, policy_loss=policy)
  if kl is None:
    if beta:
      raise ValueError("beta > 0 needs the per-position KL to the reference (kl=)")
    return policy, metrics
  mean_kl = token_mean(kl, mask)
  return policy + beta * mean_kl, dict(metrics, kl=mean_kl)


__all__ = [
  "group_advantages",
  "token_mean",
  "clipped_objective",
  "kl_per_token",
  "exact_kl",
  "grpo_loss",
]
