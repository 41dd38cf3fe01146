"""The SetDLM sampler's no-cache reference: the same loop as `set_sampler`, no KV cache.

Every step runs one uncached forward over [all committed tokens in commit order (clean, causal)
| active masks]: the same conditionals as the cached sampler (SPEC §11.6), so with the same key
it commits the same tokens at the same steps. It is the correctness and speed reference of
`set_sampler.set_step` (tests, `benchmarks/sampling.py`), never used by a run.

  reference_generate(model, params, prompts, cfg, rng=None)   -> SampleOutput (as set_generate)
  reference_infill(model, params, canvases, cfg, rng=None)    -> SampleOutput (as set_infill)

Its model state is (commit_rank int32 [B, Lc], next_rank int32 [B]): the rank of each committed
position in commit order (context first, in position order; BIG = not committed). Forward calls
per row = the steps the row ran (no context-encoding call).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from setdiff_jax.diffusion import masks
from setdiff_jax.sampling import loop
from setdiff_jax.sampling.cache import Forward, bind
from setdiff_jax.sampling.config import SampleOutput, SamplerConfig
from setdiff_jax.sampling.set_inputs import SetInputs
from setdiff_jax.sampling.set_sampler import (
  BIG,
  SetState,
  advance,
  generate_with,
  infill_with,
  initial_state,
  step_window,
)


def reference_init(inp: SetInputs, window_size: int, key, logprobs: bool = False) -> SetState:
  """The initial state: the visible context ranked first, in position order (no forward call);
  `logprobs` as `set_sampler.initial_state`."""
  canvas = jnp.asarray(inp.canvas, jnp.int32)
  b, lc = canvas.shape
  vis_pos = jnp.asarray(inp.vis_pos, jnp.int32)
  n_vis = jnp.asarray(inp.n_vis, jnp.int32)
  rank = jnp.full((b, lc), BIG, jnp.int32)
  vis_valid = jnp.arange(vis_pos.shape[1])[None] < n_vis[:, None]
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], vis_pos.shape)
  cols = jnp.where(vis_valid, vis_pos, lc)  # out of range -> dropped
  rank = rank.at[rows, cols].set(
    jnp.broadcast_to(jnp.arange(vis_pos.shape[1]), vis_pos.shape), mode="drop"
  )
  calls = jnp.zeros((b,), jnp.int32)
  return initial_state(inp, window_size, key, (rank, n_vis), calls, logprobs)


def reference_step(
  fwd: Forward,
  state: SetState,
  inp: SetInputs,
  cfg: SamplerConfig,
  *,
  stop_eos: bool = False,
  history: str = "generated",
):
  """One uncached decoding step for every row that is not done; returns as `set_step`."""
  w = cfg.window
  canvas = state.canvas
  b, lc = canvas.shape
  rows = jnp.arange(b)[:, None]
  win = step_window(state, inp, cfg)
  rank, next_rank = state.model
  cols = jnp.where(win.pend_valid, state.pending_pos, lc)
  rank = rank.at[jnp.broadcast_to(rows, cols.shape), cols].set(
    next_rank[:, None] + jnp.arange(w)[None], mode="drop"
  )
  next_rank = next_rank + win.pend_n
  order = jnp.argsort(rank, axis=-1, stable=True).astype(jnp.int32)  # commit order
  clean_valid = jnp.take_along_axis(rank, order, -1) < BIG
  tokens = jnp.concatenate(
    [jnp.take_along_axis(canvas, order, -1), jnp.full((b, w), cfg.mask_token_id, jnp.int32)], -1
  )
  positions = jnp.concatenate([order, win.pos_c], -1)
  mask = masks.cached_step_mask(jnp.zeros((b, 0), bool), clean_valid, win.valid)
  logits, _ = fwd.apply(fwd.params, tokens, positions, mask, None, lc)
  return advance(
    state, inp, cfg, win, logits, (rank, next_rank), stop_eos=stop_eos, history=history
  )


@functools.partial(jax.jit, static_argnames=("apply", "cfg", "stop_eos", "history"))
def _reference_core(
  apply, params, inp: SetInputs, key, *, cfg: SamplerConfig, stop_eos: bool, history: str
):
  fwd = bind(apply, params)
  state = reference_init(inp, cfg.window, key, cfg.rollout_stats)
  step = lambda s: reference_step(fwd, s, inp, cfg, stop_eos=stop_eos, history=history)[0]  # noqa: E731
  return loop.results(loop.until_done(step, state))


def reference_generate(model, params, prompts, cfg: SamplerConfig, rng=None) -> SampleOutput:
  """`set_sampler.set_generate` without the cache (a full uncached forward per step)."""
  return generate_with(_reference_core, model, params, prompts, cfg, rng)


def reference_infill(model, params, canvases, cfg: SamplerConfig, rng=None) -> SampleOutput:
  """`set_sampler.set_infill` without the cache (a full uncached forward per step)."""
  return infill_with(_reference_core, model, params, canvases, cfg, rng)


__all__ = ["reference_init", "reference_step", "reference_generate", "reference_infill"]
