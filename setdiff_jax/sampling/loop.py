"""The shell every sampler's loop shares; the samplers differ only in their start and step.

  res = run_on_mesh(model, params, rng, cfg, lambda fwd, place, key: core(fwd.apply, fwd.params,
                    *place(rows), key, cfg=...))      # host: the jitted loop on the params' mesh
  state = until_done(step, state)                     # in the loop: step while a row is live
  return results(state, plen=plen)                    # the arrays the host side reads
  out = finalize(res, target, valid, cfg)             # host: compaction, EOS cut -> SampleOutput
  out = prompted_output(res, target, cfg, width)      # rows = prompt + span (BD3LM, MDLM)
  out = set_output(res, inp, cfg)                     # the set sampler (+ its cache order)
  out = ar_output(res, target, cfg, width)            # AR: commit steps, cache order from n_gen

A loop state has per-row fields canvas [B, Lc], commit_step [B, Lc], step, calls, committed,
stopped, done [B] and logprob ([B, Lc] or None); AR counts n_gen instead of step / committed.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.sampling import placement
from setdiff_jax.sampling.cache import Forward, as_forward, vocab_size
from setdiff_jax.sampling.config import SampleOutput, SamplerConfig
from setdiff_jax.sampling.set_inputs import SetInputs, cache_ranks, check_vocab


# ----------------------------------------------------------------------------- host: the call
def key_of(rng, cfg: SamplerConfig):
  """The loop's PRNG key: `rng`, else PRNGKey(cfg.seed)."""
  if rng is None:
    return jax.random.PRNGKey(cfg.seed)
  if isinstance(rng, (int, np.integer)):
    raise ValueError(
      f"rng={rng}: pass a PRNG key (jax.random.key({rng}) or jax.random.PRNGKey({rng})), or "
      "leave rng out to draw from the config's seed"
    )
  return rng


def run_on_mesh(
  model, params, rng, cfg: SamplerConfig, call: Callable, ids=None, what: str = "prompt"
) -> dict:
  """`call(fwd, place, key)` (a jitted loop on `fwd = as_forward(model, params)`) on the params'
  mesh: `place(x)` splits rows over (data, fsdp) (`placement.place_rows`). Returns its results
  as host NumPy arrays (gathered across processes). `ids` (int [B, Lc], the canvas the loop
  reads; row i = the caller's `what` i) are checked against the model's vocabulary first."""
  fwd: Forward = as_forward(model, params)
  check_vocab(ids if ids is not None else np.zeros((0, 0), np.int32), cfg, vocab_size(fwd), what)
  mesh = placement.mesh_of(fwd.params)  # the params' mesh: rows split over (data, fsdp)
  with placement.on(mesh):
    res = call(fwd, lambda x: placement.place_rows(mesh, x), key_of(rng, cfg))
  return placement.to_host(res)


# ----------------------------------------------------------------------------- in the loop
def until_done(step: Callable, state):
  """`step(state) -> state` in a `lax.while_loop` until every row is done."""
  return jax.lax.while_loop(lambda s: jnp.any(~s.done), step, state)


def results(state, **extra) -> dict:
  """The arrays `finalize` reads from a finished loop state (`extra`: e.g. plen)."""
  return dict(
    canvas=state.canvas,
    commit_step=state.commit_step,
    num_steps=state.step,
    forward_calls=state.calls,
    num_committed=state.committed,
    stopped=state.stopped,
    token_logprob=state.logprob,
    **extra,
  )


# ----------------------------------------------------------------------------- host: outputs
def finalize(res, target: np.ndarray, valid: np.ndarray, cfg: SamplerConfig) -> SampleOutput:
  """Host-side compaction: drop leftover masks; cut after the stopping EOS."""
  res = placement.to_host(res)
  canvas = np.asarray(res["canvas"])
  stopped = np.asarray(res["stopped"]).astype(bool)
  sequences, generated = [], []
  for b in range(canvas.shape[0]):
    keep = valid[b] & ~(target[b] & (canvas[b] == cfg.mask_token_id))
    if stopped[b]:
      eos = np.nonzero(target[b] & (canvas[b] == cfg.eos_token_id))[0]
      keep &= np.arange(canvas.shape[1]) <= eos[0]
    sequences.append(canvas[b][keep].tolist())
    generated.append(canvas[b][keep & target[b]].tolist())
  logprob = res.get("token_logprob")
  return SampleOutput(
    sequences=sequences,
    generated=generated,
    canvas=canvas,
    target=target,
    commit_step=np.asarray(res["commit_step"]),
    num_steps=np.asarray(res["num_steps"]),
    forward_calls=np.asarray(res["forward_calls"]),
    num_committed=np.asarray(res["num_committed"]),
    stopped=stopped,
    token_logprob=None if logprob is None else np.asarray(logprob, np.float32),
  )


def prompted_output(res, target, cfg: SamplerConfig, width: Optional[int] = None) -> SampleOutput:
  """The SampleOutput of a prompted loop's results (with `plen`): valid = prompt + target span;
  `width` cuts the canvas to the unbucketed P + N."""
  res = dict(res)
  if width is not None:
    target = target[:, :width]
    cut = ("canvas", "commit_step", "token_logprob")
    res = dict(res, **{k: res[k][:, :width] for k in cut if res.get(k) is not None})
  valid = np.zeros_like(target)
  plen = np.asarray(res.pop("plen"))
  for b in range(target.shape[0]):
    valid[b, : plen[b]] = True
  valid |= target
  return finalize(res, target, valid, cfg)


def set_output(res, inp: SetInputs, cfg: SamplerConfig) -> SampleOutput:
  """The set sampler's SampleOutput of rows `inp`, with its cache order under rollout_stats."""
  target, valid = np.asarray(inp.target), np.asarray(inp.valid)
  out = finalize(res, target, valid, cfg)
  if cfg.rollout_stats:
    out.cache_order = cache_ranks(valid, target, out.commit_step, np.asarray(inp.cache_key))
  return out


def ar_output(res, target, cfg: SamplerConfig, width: Optional[int] = None) -> SampleOutput:
  """AR's SampleOutput from results with `n_gen` and `plen`: generated token i of a row is
  committed at step i; under rollout_stats the cache order is the position (the cache holds the
  prompt, then each generated token in turn)."""
  res = dict(res)
  plen, n_gen = np.asarray(res["plen"]), np.asarray(res.pop("n_gen"))
  lc = np.asarray(res["canvas"]).shape[1]
  idx = np.arange(lc)[None] - plen[:, None]
  commit_step = np.where((idx >= 0) & (idx < n_gen[:, None]), idx, -1).astype(np.int32)
  res = dict(res, commit_step=commit_step, num_steps=n_gen, num_committed=n_gen)
  out = prompted_output(res, target, cfg, width)
  if cfg.rollout_stats:
    width = out.target.shape[1]
    known = (np.arange(width)[None] < plen[:, None]) | (out.commit_step >= 0)
    out.cache_order = np.where(known, np.arange(width)[None], -1).astype(np.int32)
  return out


__all__ = [
  "key_of",
  "run_on_mesh",
  "until_done",
  "results",
  "finalize",
  "prompted_output",
  "set_output",
  "ar_output",
]
