"""MDLM infilling: every mask of a canvas generated with the whole canvas visible (SPEC §4.8).

The MDLM sampler's predict-and-noise loop applied to an infill canvas: one sub-block = all masked
positions of the row, no KV cache (bidirectional attention over the real tokens; padding is masked
out of attention).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.diffusion import masks
from setdiff_jax.sampling import loop, policies, processors
from setdiff_jax.sampling.config import count_table
from setdiff_jax.sampling.set_inputs import infill_rows


@functools.partial(jax.jit, static_argnames=("apply", "cfg"))
def _mdlm_infill_core(apply, params, canvas, target, valid, counts, nsteps, key, *, cfg):
  b, length = canvas.shape
  m = cfg.mask_token_id
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  attn = masks.padding_mask(valid) | jnp.eye(length, dtype=bool)[None]  # no row is empty

  def cond(s):
    return jnp.any(~s["done"])

  def body(s):
    live = ~s["done"]
    logits, _ = apply(params, s["canvas"], positions, attn, None, 0)
    is_mask = target & (s["canvas"] == m) & live[:, None]
    key, sub = jax.random.split(s["key"])
    hist = (valid & (s["canvas"] != m)) if cfg.repetition_penalty != 1.0 else None
    n_i = processors.schedule_count(counts, s["step"])
    cand, keep, carry, _ = processors.decide(
      logits, is_mask, n_i, sub, cfg, s["canvas"], hist, s["carry"], positions
    )
    canvas, commit_step = processors.scatter_commits(
      s["canvas"], s["commit_step"], positions, keep, cand, s["step"]
    )
    step = s["step"] + live.astype(jnp.int32)
    done = s["done"] | ~jnp.any(target & (canvas == m), -1) | (step >= nsteps)
    return dict(
      canvas=canvas,
      commit_step=commit_step,
      step=step,
      done=done,
      calls=s["calls"] + live.astype(jnp.int32),
      committed=s["committed"] + jnp.sum(keep, -1).astype(jnp.int32),
      key=key,
      carry=carry,
    )

  init = dict(
    canvas=canvas,
    commit_step=jnp.full(canvas.shape, -1, jnp.int32),
    step=jnp.zeros((b,), jnp.int32),
    done=~jnp.any(target, -1),
    calls=jnp.zeros((b,), jnp.int32),
    committed=jnp.zeros((b,), jnp.int32),
    key=key,
    carry=policies.carry_init(b, length),
  )
  s = jax.lax.while_loop(cond, body, init)
  return dict(
    canvas=s["canvas"], num_steps=s["step"], forward_calls=s["calls"], num_committed=s["committed"]
  )


def mdlm_infill(
  model,
  params,
  canvases: Sequence[Sequence[int]],
  cfg,
  rng=None,
  *,
  length: Optional[int] = None,
  max_targets: Optional[int] = None,
):
  """MDLM infilling: every M of each canvas is generated with the whole canvas visible.

  Predict-and-noise (SPEC §4.8) over one sub-block = all masked positions of the row: N = the
  row's number of masks, min(T, N) steps, n_i most confident masks committed per step plus those
  with probability >= tau. Each step is one full bidirectional forward over the row's real tokens
  (padding is masked out of attention). Canvases are right-padded to `length` (default: the
  longest) and the step table to `max_targets` columns, so fixed sizes compile once.

  Returns dict of NumPy arrays: canvas [B, Lc], num_steps [B], forward_calls [B], num_committed [B].
  """
  rows = infill_rows(canvases, cfg, need_gap=False)  # the set sampler's checks (ids, context)
  lc = length or max(len(c) for c in rows)
  b = len(rows)
  canvas = np.full((b, lc), cfg.pad_token_id, np.int32)
  valid = np.zeros((b, lc), bool)
  for i, c in enumerate(rows):
    if len(c) > lc:
      raise ValueError(f"canvas {i} has {len(c)} tokens > length={lc}")
    canvas[i, : len(c)] = c
    valid[i, : len(c)] = True
  target = valid & (canvas == cfg.mask_token_id)
  n_target = target.sum(-1)
  counts = count_table(n_target, cfg.num_steps)
  k = max(counts.shape[1], max_targets or 0)
  counts = np.pad(counts, ((0, 0), (0, k - counts.shape[1])))
  nsteps = np.array(
    [n if cfg.num_steps is None else min(n, cfg.num_steps) for n in n_target], np.int32
  )
  return loop.run_on_mesh(
    model,
    params,
    rng,
    cfg,
    lambda fwd, place, key: _mdlm_infill_core(
      fwd.apply, fwd.params, *place((canvas, target, valid, counts, nsteps)), key, cfg=cfg.static()
    ),
    ids=canvas,
    what="canvas",
  )


__all__ = ["mdlm_infill"]
