"""Block baseline samplers on the same cache machinery: BD3LM, MDLM (SPEC §4.8); the row
helpers the AR sampler (`ar_sampler.py`) shares with them.

Each is one jitted pure function with a `jax.lax.while_loop` over fixed shapes and per-row state,
and returns a `SampleOutput` like the set sampler (compaction of leftover masks, EOS stop).

BD3LM   the prompt is encoded first (1 call) with the grid rule; blocks of S positions start at
        the end of each row's prompt; each block runs min(T, S) predict-and-noise steps over its
        own positions; attention is always floor(k/S) <= floor(q/S) on absolute positions (cache
        included). Fused block cache: the first step of a block also feeds the finished previous
        block as clean tokens (they see the cache and themselves, never the new block) and keeps
        their K/V. Calls = 1 + steps (N + 1 for T = S). Leftover masks of a finished block are not
        cached (they are dropped at the end anyway).
MDLM    no cache: every step feeds the whole canvas (prompt + N masks, right-padded with M to
        `max_length` when `mdlm_pad_to_max_length`) with full bidirectional attention (without
        that padding, over the row's own prompt + N: never its batch's wider slots) and reads the
        logits of the current sub-block of G = `block_size` (default N) positions. Calls = steps
        (N for T = G). (The reference's `use_cache=true` quirk of re-encoding the prompt is not
        reproduced, nor is its last sub-block running past N into the M padding when the span
        does not end on a sub-block boundary: ours never decodes more than N tokens.)
Every loop takes N as an argument (AR too): AR / BD3LM pad their canvas to P + N bucketed by
`cfg.length_buckets` (never attended nor generated; the output is cut back to P + N), so
generation lengths in one bucket share a compiled program with unchanged tokens; MDLM attends its
padding, so only its N argument is shared (one program across N with a `block_size` and the
default padding to `max_length`).
The EOS stop of BD3LM / MDLM (`stop_at_eos`) is checked when a sub-block finishes, with the rule of
the set sampler (EOS at a generated position with no mask before it).

Block alignment (`cfg.align_to_blocks`, BD3LM and MDLM; the official `align_inputs_to_blocks`):
with a prompt of P tokens and G = block_size, decode blocks sit on the grid: block b covers
[A + bG, A + (b+1)G) with A = G*floor(P/G), intersected with the generated span [P, P + N), for
b < ceil(N/G) (the official block count, so when P % G != 0 the last P % G positions of the span
can be left undecoded and are compacted away). BD3LM caches only the prompt's full blocks [0, A)
(no prompt call at all when A = 0); block 0 feeds the prompt's tail [A, P) as clean tokens next to
its masks (they attend within the block under the grid rule and are never committed) and is
cached whole, prompt tail included, by the fused first step of block 1. With P % G == 0 both
settings are the same, and so are they for MDLM without `block_size` (one sub-block of N).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.diffusion import masks
from setdiff_jax.sampling import loop, policies, processors
from setdiff_jax.sampling.cache import Forward, KVCache, append, bind, prefill
from setdiff_jax.sampling.config import SampleOutput, SamplerConfig, bucket_length, step_counts
from setdiff_jax.sampling.set_inputs import _as_rows, check_prompts, prompt_width


def prompt_arrays(
  prompts, cfg: SamplerConfig, n: int, total: int | None = None, bucket: bool = True
):
  """Left-aligned prompts: prompt int32 [B, Pmax] (pad), plen int32 [B]; canvas int32 [B, Lc]
  (prompt ++ M*N, M after), target bool [B, Lc]; Lc = max(Pmax + N, total). With `bucket`,
  Pmax is the longest prompt bucketed (`set_inputs.prompt_width`; padding is never attended)."""
  rows = _as_rows(prompts, "prompts")
  check_prompts(rows, cfg, n)
  b = len(rows)
  pmax = prompt_width(rows, cfg) if bucket else max(len(p) for p in rows)
  lc = max(pmax + n, total or 0)
  prompt = np.full((b, pmax), cfg.pad_token_id, np.int32)
  canvas = np.full((b, lc), cfg.mask_token_id, np.int32)
  target = np.zeros((b, lc), bool)
  plen = np.array([len(p) for p in rows], np.int32)
  for i, p in enumerate(rows):
    prompt[i, : len(p)] = p
    canvas[i, : len(p)] = p
    target[i, len(p) : len(p) + n] = True
  return prompt, plen, canvas, target


def gen_width(prompts, cfg: SamplerConfig, n: int) -> int:
  """AR / BD3LM canvas width: the bucketed prompt width + N bucketed by `cfg.length_buckets`
  (within `cfg.max_length`), so that several generation lengths share one compiled loop; the
  slots past P + N are never attended nor generated and `_out` cuts them off."""
  rows = _as_rows(prompts, "prompts")
  pmax = prompt_width(rows, cfg)
  room = bucket_length(n, cfg.length_buckets)
  if cfg.max_length is not None:
    room = min(room, int(cfg.max_length) - pmax)
  return pmax + max(room, n)


def loop_cfg(cfg: SamplerConfig) -> SamplerConfig:
  """The static config of a loop that takes N as an argument (N and L stay host-side)."""
  return cfg.static().replace(max_new_tokens=1, max_length=None)


# ----------------------------------------------------------------------------- BD3LM / MDLM
@flax.struct.dataclass
class _BlockState:
  canvas: jax.Array
  commit_step: jax.Array
  cache: Any  # KVCache (BD3LM) or None (MDLM)
  blk: jax.Array  # current sub-block index
  bstep: jax.Array  # steps run in the current sub-block
  fuse: jax.Array  # bool: the previous block still has to be cached (BD3LM)
  step: jax.Array
  done: jax.Array
  calls: jax.Array
  committed: jax.Array
  stopped: jax.Array
  key: jax.Array
  carry: Any = None  # policies.Carry [B, Lc] (the history policies' state)
  logprob: Any = None  # fp32 [B, Lc]: log-probability of each committed token (rollout_stats)


def _block_init(canvas, cache, calls, key, cfg: SamplerConfig) -> _BlockState:
  """The state before block 0: nothing committed; `calls` [B] the prompt calls already made."""
  b, lc = canvas.shape
  zeros = jnp.zeros((b,), jnp.int32)
  return _BlockState(
    canvas=canvas,
    commit_step=jnp.full(canvas.shape, -1, jnp.int32),
    cache=cache,
    blk=zeros,
    bstep=zeros,
    fuse=jnp.zeros((b,), bool),
    step=zeros,
    done=jnp.zeros((b,), bool),
    calls=calls,
    committed=zeros,
    stopped=jnp.zeros((b,), bool),
    key=key,
    carry=policies.carry_init(b, lc),
    logprob=jnp.zeros((b, lc), jnp.float32) if cfg.rollout_stats else None,
  )


def _block_commit(
  s: _BlockState,
  logits,
  bpos,
  bin_,
  target,
  counts,
  nblk_steps,
  n,
  g,
  cfg: SamplerConfig,
  stop_eos: bool,
):
  """Commit rule on the current sub-block + sub-block / row bookkeeping."""
  m = cfg.mask_token_id
  live = ~s.done
  lc = s.canvas.shape[1]
  bpos_c = jnp.minimum(bpos, lc - 1)
  is_mask = bin_ & (jnp.take_along_axis(s.canvas, bpos_c, -1) == m) & live[:, None]
  key, sub = jax.random.split(s.key)
  hist = (target & (s.canvas != m)) if cfg.repetition_penalty != 1.0 else None
  n_i = processors.schedule_count(counts, s.bstep)
  cand, keep, carry, logp = processors.decide(
    logits, is_mask, n_i, sub, cfg, s.canvas, hist, s.carry, bpos
  )
  canvas, commit_step = processors.scatter_commits(
    s.canvas, s.commit_step, bpos, keep, cand, s.step
  )
  left = jnp.any(bin_ & (jnp.take_along_axis(canvas, bpos_c, -1) == m), -1)
  block_done = live & (~left | (s.bstep + 1 >= nblk_steps))
  blk = s.blk + block_done.astype(jnp.int32)
  stopped = s.stopped
  if stop_eos:
    stopped = stopped | (block_done & processors.eos_stop(canvas, target, m, cfg.eos_token_id))
  done = s.done | (blk * g >= n) | stopped
  return s.replace(
    canvas=canvas,
    commit_step=commit_step,
    blk=blk,
    bstep=jnp.where(block_done, 0, s.bstep + live.astype(jnp.int32)),
    fuse=block_done,
    step=s.step + live.astype(jnp.int32),
    done=done,
    calls=s.calls + live.astype(jnp.int32),
    committed=s.committed + jnp.sum(keep, -1).astype(jnp.int32),
    stopped=stopped,
    key=key,
    carry=carry,
    logprob=processors.scatter_kept(s.logprob, bpos, keep, logp) if cfg.rollout_stats else None,
  )


def _block_positions(start, plen, blk, g, n):
  """Sub-block `blk`'s positions [B, G] from each row's first block `start` [B]; which of them are
  generated positions (in [P, P + N)) and which exist (the prompt's tail or generated)."""
  pos = start[:, None] + blk[:, None] * g + jnp.arange(g)[None]
  end = (plen + n)[:, None]
  return pos, (pos >= plen[:, None]) & (pos < end), pos < end


def _block_start(plen, g: int, align: bool):
  """First decode position of each row: P, or the grid block holding the prompt's tail."""
  return (plen // g) * g if align else plen


def _first_slots(kv, n: int, axis: int):
  """Every leaf's first n slots (slots on `axis`)."""
  return jax.tree_util.tree_map(lambda x: jax.lax.slice_in_dim(x, 0, n, axis=axis), kv)


def _bd3lm_forward(fwd: Forward, s: _BlockState, bpos, bvalid, start, g: int, cfg: SamplerConfig):
  """One BD3LM call on the current block: logits [B, G, V] of the block's slots, and what to cache
  (kv, positions [B, G], count [B]): the finished previous block on a block's first step (fused:
  the previous block is fed clean next to the new one), nothing (count 0) otherwise."""
  b, lc = s.canvas.shape
  bpos_c = jnp.minimum(bpos, lc - 1)
  btok = jnp.take_along_axis(s.canvas, bpos_c, -1)
  c: KVCache = s.cache
  eye = jnp.eye(2 * g, dtype=bool)[None]

  def fused():
    # The previous block from the unclipped positions (bpos_c clips a last block that runs
    # past the canvas: its "previous block" would repeat one slot and miss others).
    ppos = bpos - g
    pv = (
      (s.fuse & ~s.done)[:, None]
      & (ppos >= start[:, None])
      & (jnp.take_along_axis(s.canvas, jnp.maximum(ppos, 0), -1) != cfg.mask_token_id)
    )
    order = jnp.argsort(~pv, axis=-1, stable=True)  # valid slots first, in position order
    ppos = jnp.maximum(jnp.take_along_axis(ppos, order, -1), 0)
    pv = jnp.take_along_axis(pv, order, -1)
    tokens = jnp.concatenate([jnp.take_along_axis(s.canvas, ppos, -1), btok], -1)
    positions = jnp.concatenate([ppos, bpos_c], -1)
    k_pos = jnp.concatenate([c.positions, ppos, bpos_c], -1)
    k_valid = jnp.concatenate([c.valid, pv, bvalid], -1)
    mask = masks.grid_mask(positions, k_pos, k_valid, g)
    is_prefix_q = (jnp.arange(2 * g) < g)[None, :, None]
    is_block_k = (jnp.arange(c.capacity + 2 * g) >= c.capacity + g)[None, None, :]
    mask = mask & ~(is_prefix_q & is_block_k)  # the finished block never sees the new one
    mask = mask.at[:, :, c.capacity :].set(mask[:, :, c.capacity :] | eye)
    logits, kv = fwd.apply(fwd.params, tokens, positions, mask, c.kv, g)
    return logits, _first_slots(kv, g, c.seq_axis), ppos, jnp.sum(pv, -1).astype(jnp.int32)

  def plain():
    k_pos = jnp.concatenate([c.positions, bpos_c], -1)
    k_valid = jnp.concatenate([c.valid, bvalid], -1)
    mask = masks.grid_mask(bpos_c, k_pos, k_valid, g)
    mask = mask.at[:, :, c.capacity :].set(mask[:, :, c.capacity :] | eye[:, :g, :g])
    logits, kv = fwd.apply(fwd.params, btok, bpos_c, mask, c.kv, 0)
    return logits, kv, bpos_c, jnp.zeros((b,), jnp.int32)  # nothing is cached (count 0)

  return jax.lax.cond(jnp.any(s.fuse & ~s.done), fused, plain)


@functools.partial(jax.jit, static_argnames=("apply", "cfg", "g", "stop_eos"))
def _bd3lm_core(
  apply,
  params,
  prompt,
  plen,
  canvas,
  target,
  counts,
  n,
  key,
  *,
  cfg: SamplerConfig,
  g: int,
  stop_eos: bool,
):
  """n: int32 [] new tokens (an argument: the canvas [B, Lc] may be wider, `gen_width`)."""
  fwd = bind(apply, params)
  b, pmax = prompt.shape
  start = _block_start(plen, g, cfg.align_to_blocks)  # positions < start are cached up front
  pos = jnp.broadcast_to(jnp.arange(pmax, dtype=jnp.int32), (b, pmax))
  pvalid = pos < start[:, None]
  pmask = masks.grid_mask(pos, pos, pvalid, g) | jnp.eye(pmax, dtype=bool)[None]
  # Capacity: each position is cached at most once; a fused write covers G slots past the length.
  cache, _ = prefill(fwd, prompt, pos, pvalid, canvas.shape[1] + g, mask=pmask)
  state = _block_init(canvas, cache, (start > 0).astype(jnp.int32), key, cfg)

  def body(s: _BlockState):
    bpos, bin_, bvalid = _block_positions(start, plen, s.blk, g, n)
    # The append stays outside the cond (written inside a branch, XLA copied every layer's cache
    # per step); a plain step writes its slots past the length with count 0, i.e. not at all.
    logits, kv, kpos, count = _bd3lm_forward(fwd, s, bpos, bvalid, start, g, cfg)
    s = s.replace(cache=append(s.cache, kv, kpos, count))
    return _block_commit(
      s, logits, bpos, bin_, target, counts, counts.shape[1], n, g, cfg, stop_eos
    )

  return loop.results(loop.until_done(body, state), plen=plen)


def bd3lm_generate(model, params, prompts, cfg: SamplerConfig, rng=None) -> SampleOutput:
  """BD3LM block decoding with the fused block cache (SPEC §4.8); S = `cfg.block_size`."""
  if cfg.block_size is None:
    raise ValueError("bd3lm_generate needs cfg.block_size (the trained block size S)")
  g = int(cfg.block_size)
  n = cfg.max_new_tokens
  prompt, plen, canvas, target = prompt_arrays(prompts, cfg, n, gen_width(prompts, cfg, n))
  counts = step_counts(g, cfg.num_steps)[None].astype(np.int32)
  res = loop.run_on_mesh(
    model,
    params,
    rng,
    cfg,
    lambda fwd, place, key: _bd3lm_core(
      fwd.apply,
      fwd.params,
      *place((prompt, plen, canvas, target)),
      counts,
      place(np.int32(n)),
      key,
      cfg=loop_cfg(cfg),
      g=g,
      stop_eos=cfg.stops_at_eos,
    ),
    ids=canvas,
  )
  out = loop.prompted_output(res, target, cfg, prompt.shape[1] + n)
  if cfg.rollout_stats:
    out.cache_order = block_cache_calls(plen, out.target, out.commit_step, g, cfg.align_to_blocks)
  return out


def block_cache_calls(plen, target, commit_step, g: int, align: bool) -> np.ndarray:
  """BD3LM's `SampleOutput.cache_order`, int32 [B, Lc]: the call that caches each clean token (0:
  the prompt prefill, b + 1: decode block b, cached whole by the fused first step of block b + 1
  (the last block's rank is the one it would get); -1: padding, never committed."""
  plen = np.asarray(plen)
  lc = target.shape[1]
  pos = np.arange(lc)[None]
  start = ((plen // g) * g if align else plen)[:, None]
  seg = np.where(pos < start, 0, (pos - start) // g + 1)
  known = (pos < plen[:, None]) | (commit_step >= 0)
  return np.where(known, seg, -1).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("apply", "cfg", "g", "stop_eos", "padded"))
def _mdlm_core(
  apply,
  params,
  plen,
  canvas,
  target,
  counts,
  n,
  key,
  *,
  cfg: SamplerConfig,
  g: int,
  stop_eos: bool,
  padded: bool,
):
  """n: int32 [] new tokens (an argument: with `mdlm_pad_to_max_length` and a `block_size`
  neither the canvas nor G depends on N, so generation lengths share one loop). `padded`: every
  row's canvas is padded with M to max_length, padding attended as the reference does; otherwise
  a row attends its own prompt + N only (never the slots a longer prompt in its batch adds)."""
  fwd = bind(apply, params)
  b, lm = canvas.shape
  nblk_steps = counts.shape[1]
  positions = jnp.broadcast_to(jnp.arange(lm, dtype=jnp.int32), (b, lm))
  if padded:  # bidirectional over the whole canvas, the M padding included
    full = jnp.ones((b, lm, lm), bool)
  else:  # bidirectional over [0, P_b + N): a row's tokens never depend on its batch
    own = positions < (plen + n)[:, None]
    full = jnp.broadcast_to(own[:, None, :], (b, lm, lm))
  state = _block_init(canvas, None, jnp.zeros((b,), jnp.int32), key, cfg)
  start = _block_start(plen, g, cfg.align_to_blocks)

  def body(s: _BlockState):
    bpos, bin_, _ = _block_positions(start, plen, s.blk, g, n)
    logits, _ = fwd.apply(fwd.params, s.canvas, positions, full, None, 0)
    logits = jnp.take_along_axis(logits, jnp.minimum(bpos, lm - 1)[..., None], 1)
    return _block_commit(s, logits, bpos, bin_, target, counts, nblk_steps, n, g, cfg, stop_eos)

  return loop.results(loop.until_done(body, state), plen=plen)


def mdlm_generate(model, params, prompts, cfg: SamplerConfig, rng=None) -> SampleOutput:
  """MDLM sub-block predict-and-noise without a cache (SPEC §4.8); G = `cfg.block_size` or N."""
  n = cfg.max_new_tokens
  g = int(cfg.block_size or n)
  if cfg.block_size is None:  # one sub-block over the whole span: there is no grid to align to
    cfg = cfg.replace(align_to_blocks=False)
  total = cfg.max_length if (cfg.mdlm_pad_to_max_length and cfg.max_length) else None
  # No bucketing: MDLM attends the M padding after the prompts, so its width is part of the
  # result (padded to max_length by default, which compiles one program anyway).
  _, plen, canvas, target = prompt_arrays(prompts, cfg, n, total, bucket=False)
  counts = step_counts(g, cfg.num_steps)[None].astype(np.int32)
  res = loop.run_on_mesh(
    model,
    params,
    rng,
    cfg,
    lambda fwd, place, key: _mdlm_core(
      fwd.apply,
      fwd.params,
      *place((plen, canvas, target)),
      counts,
      place(np.int32(n)),
      key,
      cfg=loop_cfg(cfg),
      g=g,
      stop_eos=cfg.stops_at_eos,
      padded=total is not None,
    ),
    ids=canvas,
  )
  return loop.prompted_output(res, target, cfg)


__all__ = ["bd3lm_generate", "mdlm_generate"]
