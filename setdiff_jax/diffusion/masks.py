"""Attention rules in *rank space* (SPEC §2). True = the query may attend to the key.

Two-stream layout (SPEC §2.1): slots 0..L-1 are the clean stream, slots L..2L-1 the noisy stream,
both in sampled order; the mask depends only on slot indices, never on the order itself, so it is
built once per length. Padding is combined separately (`two_stream_padding`), permuted with the
order, which is correct in general (the reference applies the unpermuted padding mask, SPEC §2.5).

The decoding masks live here too (`cached_step_mask`, `causal_valid_mask`, `grid_mask`): the
samplers only apply them to their cache's positions. So do the masks of a sampled rollout that
exact trajectory scoring (`rl.scoring`) rebuilds: `rollout_set_mask` (SetDLM, one two-stream pass),
`rollout_block_clean_mask` / `rollout_block_step_mask` (BD3LM, replayed step by step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _two_stream_indices(length: int):
  slot = np.arange(2 * length)
  return slot % length, slot >= length  # rank, is_noisy


def set_causal_mask(length: int) -> np.ndarray:
  """SetDLM two-stream mask, bool [2L, 2L] (SPEC §2.2).

  clean->clean: rank(k) <= rank(q); noisy->clean: rank(k) < rank(q); noisy->noisy: same slot only;
  clean queries never see noisy keys.
  """
  rank, noisy = _two_stream_indices(length)
  rq, rk = rank[:, None], rank[None, :]
  nq, nk = noisy[:, None], noisy[None, :]
  clean_clean = ~nq & ~nk & (rk <= rq)
  noisy_clean = nq & ~nk & (rk < rq)
  noisy_self = nq & nk & (rk == rq)
  return clean_clean | noisy_clean | noisy_self


def block_causal_mask(length: int, block_size: int) -> np.ndarray:
  """BD3LM two-stream mask, bool [2L, 2L] (SPEC §2.7), block ids over positions (= ranks).

  clean->clean: block(k) <= block(q); noisy->clean: block(k) < block(q);
  noisy->noisy: block(k) == block(q). With block_size=1 in rank space this is `set_causal_mask`.
  """
  if length % block_size:
    raise ValueError(f"block_size={block_size} must divide length={length}")
  rank, noisy = _two_stream_indices(length)
  block = rank // block_size
  bq, bk = block[:, None], block[None, :]
  nq, nk = noisy[:, None], noisy[None, :]
  return (~nq & ~nk & (bk <= bq)) | (nq & ~nk & (bk < bq)) | (nq & nk & (bk == bq))


def causal_mask(length: int) -> np.ndarray:
  """Lower-triangular bool [L, L] (AR, and the clean-causal cache encoding of a prompt)."""
  return np.tril(np.ones((length, length), dtype=bool))


def bidirectional_mask(length: int) -> np.ndarray:
  """All-True bool [L, L] (MDLM)."""
  return np.ones((length, length), dtype=bool)


def padding_mask(valid) -> jnp.ndarray:
  """Outer product of a validity vector: bool [B, n] -> [B, n, n]."""
  valid = jnp.asarray(valid).astype(bool)
  return valid[:, :, None] & valid[:, None, :]


def two_stream_padding(valid_in_order) -> jnp.ndarray:
  """Padding mask of the two-stream input: bool [B, L] (validity *in sampled order*) -> [B, 2L, 2L]."""
  valid = jnp.asarray(valid_in_order).astype(bool)
  return padding_mask(jnp.concatenate([valid, valid], axis=-1))


def cached_step_mask(cache_valid, pending_valid, active_valid) -> jnp.ndarray:
  """Mask for one KV-cached decoding step (SPEC §2.8), fixed shapes.

  Keys are [cache (C slots) | pending clean tokens (P slots) | active masks (A slots)]; queries are
  [pending | active]. A pending token sees the cache and the pending tokens up to itself (causal in
  slot order); an active mask sees the cache, every pending token and itself, never other masks.
  Invalid slots are excluded as keys; an invalid query row still sees the valid keys and itself
  (so no row is empty); its output is never read.

  Args:
    cache_valid: bool [B, C] (which cache slots hold committed tokens).
    pending_valid: bool [B, P]; active_valid: bool [B, A].
  Returns:
    bool [B, P + A, C + P + A].
  """
  cache_valid = jnp.asarray(cache_valid, bool)
  pending_valid = jnp.asarray(pending_valid, bool)
  active_valid = jnp.asarray(active_valid, bool)
  batch = cache_valid.shape[0]
  p, a = pending_valid.shape[-1], active_valid.shape[-1]
  q_valid = jnp.concatenate([pending_valid, active_valid], -1)  # [B, Q]
  q_idx = jnp.arange(p + a)
  q_is_mask = q_idx >= p
  # Rule over the step's own inputs (queries x keys), independent of the batch.
  own = jnp.where(
    q_is_mask[:, None],
    (q_idx[None, :] < p) | (q_idx[None, :] == q_idx[:, None]),  # masks: pending + self
    q_idx[None, :] <= q_idx[:, None],
  )  # pending: causal
  own = own[None] & q_valid[:, None, :]
  own = own | jnp.eye(p + a, dtype=bool)[None]  # keep every row non-empty
  to_cache = jnp.broadcast_to(cache_valid[:, None, :], (batch, p + a, cache_valid.shape[-1]))
  return jnp.concatenate([to_cache, own], axis=-1)


__all__ = [
  "set_causal_mask",
  "block_causal_mask",
  "causal_mask",
  "bidirectional_mask",
  "padding_mask",
  "two_stream_padding",
  "cached_step_mask",
  "causal_valid_mask",
  "grid_mask",
  "rollout_set_mask",
  "rollout_block_clean_mask",
  "rollout_block_step_mask",
]


def causal_valid_mask(valid: jax.Array) -> jax.Array:
  """Clean-causal mask over slot order: bool [B, S, S]; invalid queries see only themselves."""
  s = valid.shape[-1]
  tri = jnp.tril(jnp.ones((s, s), bool))[None]
  return (tri & valid[:, None, :]) | jnp.eye(s, dtype=bool)[None]


def grid_mask(q_pos, k_pos, k_valid, block_size: int) -> jax.Array:
  """BD3LM rule on absolute positions: q sees k iff floor(k/S) <= floor(q/S) (SPEC §4.8).

  q_pos [B, Q], k_pos [B, K], k_valid [B, K] -> bool [B, Q, K].
  """
  qb = q_pos // block_size
  kb = k_pos // block_size
  return (kb[:, None, :] <= qb[:, :, None]) & k_valid[:, None, :]


def rollout_set_mask(valid, commit_step, cache_order) -> jax.Array:
  """The two-stream mask of a SetDLM rollout as the KV-cached sampler saw it, bool [B, 2L, 2L].

  Slots 0..L-1 are the clean tokens, L..2L-1 a mask token per position, both in position order
  (the rule lives in the mask, not in the slot order). With valid = context | committed,
  commit_step (-1 for context) and cache_order (the rank at which each clean token entered the
  cache, context first; `SampleOutput.cache_order`):
    clean -> clean: valid keys with cache_order(k) <= cache_order(q) (the cache is causal in the
      order tokens entered it, SPEC §2.8);
    noisy -> clean: the noisy query of a token committed at step t sees the valid keys committed
      at steps < t, context included (commit_step -1) -- not every lower rank, as the training
      `set_causal_mask` does: a set committed in one step was predicted from the same cache;
    noisy -> noisy: itself only. Rows of invalid or context positions' noisy slots see themselves.
  Args: valid bool [B, L]; commit_step, cache_order int [B, L].
  """
  valid = jnp.asarray(valid, bool)
  step = jnp.asarray(commit_step, jnp.int32)
  order = jnp.asarray(cache_order, jnp.int32)
  length = valid.shape[-1]
  gen = valid & (step >= 0)
  clean = valid[:, :, None] & valid[:, None, :] & (order[:, None, :] <= order[:, :, None])
  noisy = gen[:, :, None] & valid[:, None, :] & (step[:, None, :] < step[:, :, None])
  eye = jnp.broadcast_to(jnp.eye(length, dtype=bool)[None], clean.shape)
  zeros = jnp.zeros_like(clean)
  top = jnp.concatenate([clean | eye, zeros], -1)
  bottom = jnp.concatenate([noisy, eye], -1)
  return jnp.concatenate([top, bottom], 1)


def rollout_block_clean_mask(positions, valid, segment, block_size: int) -> jax.Array:
  """The clean pass of a BD3LM rollout, bool [B, L, L]: every clean token's K/V as the sampler
  cached them. segment = the call that cached it (0: the prompt prefill, b + 1: decode block b;
  `SampleOutput.cache_order`); a query sees valid keys of its own or an earlier call that pass
  the grid rule on absolute positions (SPEC §4.8), and itself."""
  seg = jnp.asarray(segment, jnp.int32)
  mask = grid_mask(positions, positions, jnp.asarray(valid, bool), block_size)
  mask = mask & (seg[:, None, :] <= seg[:, :, None])
  return mask | jnp.eye(seg.shape[-1], dtype=bool)[None]


def rollout_block_step_mask(
  q_pos, q_valid, k_pos, k_valid, k_segment, segment, block_size: int
) -> jax.Array:
  """One replayed BD3LM step, bool [B, G, L + G]: the block's G slots (q_pos, q_valid [B, G]) see
  the cached clean tokens of earlier calls (k_* [B, L], k_segment < segment [B]) and the block's
  own valid slots, by the grid rule; every slot sees itself."""
  seg = jnp.asarray(k_segment, jnp.int32)
  cached = grid_mask(
    q_pos, k_pos, jnp.asarray(k_valid, bool) & (seg < segment[:, None]), block_size
  )
  own = grid_mask(q_pos, q_pos, jnp.asarray(q_valid, bool), block_size)
  own = own | jnp.eye(q_pos.shape[-1], dtype=bool)[None]
  return jnp.concatenate([cached, own], -1)
