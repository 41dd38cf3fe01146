"""Host-side inputs of the SetDLM sampler (SPEC §4.2, §4.3, §4.5): the padded batch arrays.

`SetInputs` holds one batch as fixed NumPy arrays (canvas, targets, context positions, per-row step
schedules, the cache order of committed sets); `prompted_inputs` (prompt ++ [M] * N per row) and
`infill_inputs` (M wherever a canvas is to be filled) build it through `build_inputs`;
`_fht_keys` draws the 'fht' cache order. Plain NumPy, never jitted; the samplers
(`set_sampler`, `reference`, `baselines`) read these arrays.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import numpy as np

from setdiff_jax.diffusion import orders
from setdiff_jax.sampling.config import SamplerConfig, bucket_length, count_table


@flax.struct.dataclass
class SetInputs:
  """Host-prepared arrays of one batch.

  canvas int32 [B, Lc] (context tokens, M at targets, pad elsewhere); target bool [B, Lc];
  valid bool [B, Lc] (positions that exist); vis_pos int32 [B, Vc] (context positions in position
  order, padded); n_vis int32 [B]; counts int32 [B, K] (n_i per row); nsteps int32 [B];
  cache_key int32 [B, Lc] (order of a committed set in the cache; smaller first).
  """

  canvas: Any
  target: Any
  valid: Any
  vis_pos: Any
  n_vis: Any
  counts: Any
  nsteps: Any
  cache_key: Any


def _as_rows(rows, what: str):
  """Token-id rows as int64 arrays; ids that are not integers (2.7, "a") are refused, never cut."""
  if isinstance(rows, np.ndarray) and rows.ndim == 1:
    rows = [rows]
  out = []
  for i, r in enumerate(rows):
    a = np.asarray(r)
    if a.size and a.dtype.kind not in "iu":
      raise ValueError(
        f"{what}: row {i} holds {a.dtype} values, not integer token ids (a float or string "
        "would be cut or misread); pass the tokenizer's ids"
      )
    out.append(a.astype(np.int64).reshape(-1))
  if not out:
    raise ValueError(f"no {what} given")
  return out


def _check_ids(row: np.ndarray, what: str):
  if row.size and row.min() < 0:
    raise ValueError(f"{what} contains a negative token id")


def check_vocab(canvas: np.ndarray, cfg: SamplerConfig, vocab_size, what: str = "prompt"):
  """ValueError when an id the model would read or must produce lies outside its vocabulary
  [0, V): the embedding lookup fills an out-of-range row with NaN, and the row would decode to
  garbage silently; an EOS id >= V would never be generated, so a row would never stop.
  canvas int [B, Lc] (row i = the caller's `what` i); vocab_size None: unknown, not checked."""
  if vocab_size is None:
    return
  for name in ("mask_token_id", "pad_token_id", "eos_token_id"):
    value = getattr(cfg, name)
    if value is not None and int(value) >= vocab_size:
      raise ValueError(
        f"{name}={value} is outside the model's vocabulary (vocab_size={vocab_size}): take the "
        "ids from the tokenizer the model was trained with"
      )
  canvas = np.asarray(canvas)
  bad = np.nonzero((canvas >= vocab_size).any(axis=-1))[0]
  if bad.size:
    i = int(bad[0])
    raise ValueError(
      f"{what} {i} holds token id {int(canvas[i].max())}, outside the model's vocabulary "
      f"(vocab_size={vocab_size}; ids are in [0, {vocab_size})): encode it with the tokenizer "
      "the model was trained with"
    )


def _fht_keys(target: np.ndarray, cfg: SamplerConfig, length: int, seed: int) -> np.ndarray:
  """Ranks of target positions by descending staggered reveal time (S = W, S_max = 2W)."""
  w = cfg.window
  rng = np.random.default_rng(seed)
  keys = np.tile(np.arange(target.shape[1], dtype=np.int64), (target.shape[0], 1))
  for b in range(target.shape[0]):
    pos = np.nonzero(target[b])[0]
    if not len(pos):
      continue
    reveal = orders.staggered_reveal_times(rng.exponential(size=len(pos)), w, 2 * w, length=length)
    rank = np.argsort(-reveal, kind="stable")
    keys[b, pos[rank]] = np.arange(len(pos))
  return keys


def build_inputs(
  canvases: Sequence[np.ndarray],
  target_rows: Sequence[np.ndarray],
  cfg: SamplerConfig,
  seed: int = 0,
  width: int | None = None,
) -> SetInputs:
  """Pads per-row canvases into fixed arrays and computes the per-row step schedules.

  Lc = `width` (default: the longest canvas, bucketed by `cfg.length_buckets`); Vc and K are
  bucketed too. Padding slots are invalid and never targets.
  """
  b = len(canvases)
  lc = max(len(c) for c in canvases)
  lc = max(lc, bucket_length(lc, cfg.length_buckets) if width is None else int(width))
  canvas = np.full((b, lc), cfg.pad_token_id, np.int32)
  target = np.zeros((b, lc), bool)
  valid = np.zeros((b, lc), bool)
  for i, (c, t) in enumerate(zip(canvases, target_rows)):
    canvas[i, : len(c)] = c
    target[i, : len(c)] = t
    valid[i, : len(c)] = True
  canvas[target] = cfg.mask_token_id
  vis = valid & ~target
  n_vis = vis.sum(-1)
  vc = bucket_length(max(1, int(n_vis.max())), cfg.length_buckets)
  vis_pos = np.zeros((b, vc), np.int32)
  for i in range(b):
    p = np.nonzero(vis[i])[0]
    vis_pos[i, : len(p)] = p
  n_target = target.sum(-1)
  counts = count_table(n_target, cfg.num_steps)
  k = bucket_length(counts.shape[1], cfg.length_buckets)
  counts = np.pad(counts, ((0, 0), (0, k - counts.shape[1])))  # zeros: never read past nsteps
  nsteps = np.array(
    [n if cfg.num_steps is None else min(n, cfg.num_steps) for n in n_target], np.int32
  )  # min(T, N) steps per row
  if cfg.cache_order == "fht":
    if cfg.max_length is None:  # the padded width would set the schedule: buckets moved tokens
      raise ValueError(
        "cache_order='fht' draws its reveal times from a schedule over the model's context: set "
        "max_length (the model's seq_len), or use cache_order='l2r'"
      )
    cache_key = _fht_keys(target, cfg, int(cfg.max_length), seed)
  else:
    cache_key = np.tile(np.arange(lc), (b, 1))
  return SetInputs(
    canvas=canvas,
    target=target,
    valid=valid,
    vis_pos=vis_pos,
    n_vis=n_vis.astype(np.int32),
    counts=counts,
    nsteps=nsteps,
    cache_key=cache_key.astype(np.int32),
  )


def check_prompts(rows, cfg: SamplerConfig, n, per_row: bool = False):
  """Clear errors for an empty prompt, bad ids, a mask token, or prompt + N beyond the context.
  n: the new tokens of every row (an int), or of each row ([R]); `per_row`: n are the caller's
  per-row budgets (the messages name budgets[i], not max_new_tokens)."""
  budgets = np.broadcast_to(np.asarray(n), (len(rows),))
  for i, (p, n_i) in enumerate(zip(rows, budgets)):
    if len(p) == 0:
      raise ValueError(f"prompt {i} is empty; pass at least one token (e.g. [bos_token_id])")
    _check_ids(p, f"prompt {i}")
    if np.any(p == cfg.mask_token_id):
      raise ValueError(f"prompt {i} contains the mask token id {cfg.mask_token_id}")
    if cfg.max_length is not None and len(p) + n_i > cfg.max_length:
      raise ValueError(
        f"prompt {i} has {len(p)} tokens; with "
        f"{f'its budget budgets[{i}]' if per_row else 'max_new_tokens'}={int(n_i)} that is "
        f"{len(p) + int(n_i)} > the model's context length max_length={cfg.max_length}"
      )


def prompted_inputs(prompts, cfg: SamplerConfig, seed: int = 0) -> SetInputs:
  """Canvas = prompt ++ [M] * N per row (left-aligned, absolute positions 0..P+N-1)."""
  rows = _as_rows(prompts, "prompts")
  n = cfg.max_new_tokens
  check_prompts(rows, cfg, n)
  canvases = [np.concatenate([p, np.full(n, cfg.mask_token_id)]) for p in rows]
  targets = [np.arange(len(p) + n) >= len(p) for p in rows]
  return build_inputs(canvases, targets, cfg, seed, width=prompt_width(rows, cfg) + n)


def prompt_width(rows, cfg: SamplerConfig) -> int:
  """The padded prompt axis of a batch: its longest prompt bucketed by `cfg.length_buckets`,
  capped so that width + N stays within `cfg.max_length` (never below the longest prompt)."""
  pmax = max(len(p) for p in rows)
  width = bucket_length(pmax, cfg.length_buckets)
  if cfg.max_length is not None:
    width = min(width, int(cfg.max_length) - cfg.max_new_tokens)
  return max(width, pmax)


def infill_rows(canvases, cfg: SamplerConfig, need_gap: bool = True) -> list:
  """Infill canvases as int64 rows, after clear errors for no canvas, bad ids, a canvas longer
  than the model's context or (`need_gap`) one with nothing to fill: every infill sampler's
  checks (MDLM's decoder completes a batch with BOS-only rows, so it passes need_gap=False)."""
  rows = _as_rows(canvases, "canvases")
  for i, c in enumerate(rows):
    _check_ids(c, f"canvas {i}")
    if need_gap and not np.any(c == cfg.mask_token_id):
      raise ValueError(
        f"canvas {i} has no masked position (mask id {cfg.mask_token_id}): the gap is empty"
      )
    if cfg.max_length is not None and len(c) > cfg.max_length:
      raise ValueError(
        f"canvas {i} has {len(c)} tokens (text, gap positions and special tokens) > the model's "
        f"context length max_length={cfg.max_length}: shorten its text or gaps by "
        f"{len(c) - cfg.max_length} tokens"
      )
  return rows


def infill_inputs(canvases, cfg: SamplerConfig, seed: int = 0) -> SetInputs:
  """Canvases hold context tokens and M at every position to generate (any number of gaps)."""
  rows = infill_rows(canvases, cfg)
  return build_inputs(rows, [c == cfg.mask_token_id for c in rows], cfg, seed)


def cache_ranks(
  valid: np.ndarray, target: np.ndarray, commit_step: np.ndarray, cache_key: np.ndarray
) -> np.ndarray:
  """The order in which each clean token entered the set sampler's KV cache, int32 [B, Lc].

  Context first in position order (the prefill), then step by step the committed sets, each in
  `cache_key` order (the pending tokens' slot order, causal among themselves); the last step's
  commits get the rank they would enter with. -1 for padding and never-committed positions.
  """
  b, lc = valid.shape
  out = np.full((b, lc), -1, np.int32)
  context = valid & ~target
  committed = target & (commit_step >= 0)
  for i in range(b):
    group = np.where(context[i], 0, commit_step[i].astype(np.int64) + 1)
    key = np.where(context[i], np.arange(lc), cache_key[i])
    pos = np.nonzero(context[i] | committed[i])[0]
    order = pos[np.lexsort((pos, key[pos], group[pos]))]
    out[i, order] = np.arange(len(order), dtype=np.int32)
  return out


__all__ = [
  "SetInputs",
  "cache_ranks",
  "build_inputs",
  "check_prompts",
  "prompted_inputs",
  "prompt_width",
  "infill_inputs",
]
