"""Logits processors, token choice and the predict-and-noise commit rule (SPEC §4.1, §4.2, §4.8).

Order of operations on a step's raw logits (as the reference): processors (repetition penalty) ->
M logit set to -1e12 -> temperature (sampling only) -> softmax -> nucleus filter + renormalise ->
argmax or sample -> confidence = probability of the chosen token.
"""
from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from setdiff_jax.models.layers import suppress_mask_logit
from setdiff_jax.sampling.config import SamplerConfig


def seen_tokens(tokens: jax.Array, include: jax.Array, vocab_size: int) -> jax.Array:
  """Multi-hot bool [B, V] of the tokens tokens[b, j] with include[b, j]."""
  b = tokens.shape[0]
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], tokens.shape)
  hot = jnp.zeros((b, vocab_size), jnp.int32)
  hot = hot.at[rows, jnp.clip(tokens, 0, vocab_size - 1)].max(include.astype(jnp.int32))
  return hot > 0


def repetition_penalty(logits: jax.Array, seen: jax.Array, penalty: float) -> jax.Array:
  """HF `RepetitionPenaltyLogitsProcessor` on logits [B, ..., V] with seen [B, V].

  For seen tokens: score < 0 -> score * penalty, else score / penalty.
  """
  if penalty == 1.0:
    return logits
  seen = seen.reshape(seen.shape[:1] + (1,) * (logits.ndim - 2) + seen.shape[1:])
  penalised = jnp.where(logits < 0, logits * penalty, logits / penalty)
  return jnp.where(seen, penalised, logits)


def nucleus(probs: jax.Array, top_p: float) -> jax.Array:
  """Top-p filter on probabilities [..., V], renormalised; keeps the token that crosses top_p.

  Token i (in descending order) is kept iff the mass strictly before it is < top_p. Tokens tied
  with the smallest kept probability are kept too.
  """
  if top_p >= 1.0:
    return probs
  sorted_p = jnp.flip(jnp.sort(probs, axis=-1), axis=-1)
  before = jnp.cumsum(sorted_p, axis=-1) - sorted_p
  kept = before < top_p
  cutoff = jnp.min(jnp.where(kept, sorted_p, jnp.inf), axis=-1, keepdims=True)
  filtered = jnp.where(probs >= cutoff, probs, 0.0)
  return filtered / jnp.sum(filtered, axis=-1, keepdims=True)


def choose(logits: jax.Array, key: Optional[jax.Array],
           cfg: SamplerConfig) -> Tuple[jax.Array, jax.Array]:
  """Candidate token and its confidence for each row of logits [..., V] (M already suppressed).

  Returns (cand int32 [...], conf fp32 [...]).
  """
  z = logits.astype(jnp.float32)
  if not cfg.greedy and cfg.temperature != 1.0:
    z = z / cfg.temperature
  if cfg.top_p < 1.0:
    probs = nucleus(jax.nn.softmax(z, axis=-1), cfg.top_p)
    if cfg.greedy:
      cand = jnp.argmax(probs, axis=-1)
    else:
      cand = jax.random.categorical(key, jnp.log(probs), axis=-1)
    conf = jnp.take_along_axis(probs, cand[..., None], axis=-1)[..., 0]
    return cand.astype(jnp.int32), conf
  logp = jax.nn.log_softmax(z, axis=-1)
  if cfg.greedy:
    cand = jnp.argmax(z, axis=-1)
  else:
    cand = jax.random.categorical(key, logp, axis=-1)
  conf = jnp.exp(jnp.take_along_axis(logp, cand[..., None], axis=-1)[..., 0])
  return cand.astype(jnp.int32), conf


def select_commits(conf: jax.Array, valid: jax.Array, count: jax.Array,
                   threshold: Optional[float]) -> jax.Array:
  """The predict-and-noise commit rule (SPEC §4.2).

  conf [B, A], valid [B, A] (active masks), count [B] = n_i. Keeps the n_i most confident valid
  slots plus every valid slot with conf >= threshold; n_i == 0 or n_i >= |valid| keeps all valid
  slots. Ties go to the leftmost slot (stable sort; the reference's non-stable sort leaves them
  unspecified). Returns bool [B, A].
  """
  n_valid = jnp.sum(valid, axis=-1)
  score = jnp.where(valid, conf, -jnp.inf)
  order = jnp.argsort(-score, axis=-1, stable=True)
  rank = jnp.argsort(order, axis=-1)
  keep = rank < count[:, None]
  if threshold is not None and threshold <= 1.0:
    keep = keep | (conf >= threshold)
  keep_all = (count == 0) | (count >= n_valid)
  return (keep | keep_all[:, None]) & valid


def decide(logits: jax.Array, active: jax.Array, count: jax.Array, key, cfg: SamplerConfig,
           history_tokens: Optional[jax.Array] = None, history_mask: Optional[jax.Array] = None):
  """Processors + choice + commit rule for active slots.

  logits: raw fp32 [B, A, V]; active: bool [B, A]; count: n_i [B]; history_*: [B, L] (tokens and
  which of them count as seen by the repetition penalty).
  Returns (cand int32 [B, A], keep bool [B, A]).
  """
  z = logits
  if cfg.repetition_penalty != 1.0:
    seen = seen_tokens(history_tokens, history_mask, z.shape[-1])
    z = repetition_penalty(z, seen, cfg.repetition_penalty)
  z = suppress_mask_logit(z, cfg.mask_token_id)
  cand, conf = choose(z, key, cfg)
  keep = select_commits(conf, active, count, cfg.threshold)
  return cand, keep


def scatter_commits(canvas: jax.Array, commit_step: jax.Array, pos: jax.Array, keep: jax.Array,
                    cand: jax.Array, step: jax.Array):
  """Writes kept candidates at positions pos [B, A] (out-of-range positions are dropped).

  Returns (canvas, commit_step) with commit_step = step [B] at the written positions.
  """
  b, length = canvas.shape
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], pos.shape)
  where = jnp.where(keep, pos, length)  # only kept slots are written
  canvas = canvas.at[rows, where].set(cand, mode="drop")
  commit_step = commit_step.at[rows, where].set(jnp.broadcast_to(step[:, None], pos.shape),
                                                mode="drop")
  return canvas, commit_step


def schedule_count(counts: jax.Array, step: jax.Array) -> jax.Array:
  """n_i for each row: counts [B, K] at step [B] (clipped to the table)."""
  idx = jnp.minimum(step, counts.shape[1] - 1)[:, None]
  return jnp.take_along_axis(counts, idx, -1)[:, 0]


def eos_stop(canvas: jax.Array, target: jax.Array, mask_id: int, eos_id: int) -> jax.Array:
  """bool [B]: a generated position holds EOS and no generated position before it is masked."""
  length = canvas.shape[1]
  f = first_index(target & (canvas == mask_id), length)
  e = first_index(target & (canvas == eos_id), length)
  return e < f


def first_index(flag: jax.Array, default) -> jax.Array:
  """Index of the first True along the last axis, `default` where there is none."""
  return jnp.where(jnp.any(flag, -1), jnp.argmax(flag, -1), default).astype(jnp.int32)


__all__ = ["seen_tokens", "repetition_penalty", "nucleus", "choose", "select_commits",
           "decide", "scatter_commits", "schedule_count", "eos_stop", "first_index"]
