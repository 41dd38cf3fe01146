"""The AR baseline sampler on the cache machinery (SPEC §4.8, DiT path).

Causal: the prompt pass gives the first token, then one call per token feeding the last token
against the KV cache: N new tokens = N forward calls. Processors see prompt + generated. A row
stops after generating EOS (kept; nothing after it). N is a loop argument and the canvas is padded
to P + N bucketed by `cfg.length_buckets` (`baselines.gen_width`), so generation lengths in one
bucket share a compiled program with unchanged tokens.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.models.layers import suppress_mask_logit
from setdiff_jax.sampling import loop, processors
from setdiff_jax.sampling.baselines import gen_width, loop_cfg, prompt_arrays
from setdiff_jax.sampling.cache import KVCache, append, bind, prefill
from setdiff_jax.sampling.config import SampleOutput, SamplerConfig


@flax.struct.dataclass
class _ARState:
  canvas: jax.Array
  cache: KVCache
  n_gen: jax.Array
  done: jax.Array
  calls: jax.Array
  stopped: jax.Array
  key: jax.Array
  logprob: Any  # fp32 [B, Lc]: log-probability of each generated token (cfg.rollout_stats)


def _ar_choose(logits, canvas, seen_upto, key, cfg: SamplerConfig):
  """(next token int32 [B], its log-probability fp32 [B]) from logits [B, V]; history = canvas
  positions < seen_upto [B]."""
  z = logits
  if cfg.repetition_penalty != 1.0:
    hist = jnp.arange(canvas.shape[1])[None] < seen_upto[:, None]
    z = processors.repetition_penalty(
      z, processors.seen_tokens(canvas, hist, z.shape[-1]), cfg.repetition_penalty
    )
  z = suppress_mask_logit(z, cfg.mask_token_id)
  cand, _, logp = processors.choose(z, key, cfg)
  return cand, logp


def _ar_draw(logits, canvas, seen_upto, key, cfg: SamplerConfig):
  """(next key, token int32 [B], log-prob fp32 [B]) from one key, or per-row keys [B, 2]."""
  key, sub = processors.split_key(key)
  tok, lp = _ar_choose(logits, canvas, seen_upto, sub, cfg)
  return key, tok, lp


def ar_step(fwd, s: _ARState, plen, n, cfg: SamplerConfig, stop_eos: bool):
  """One decoding step: every live row feeds its last token against its cache and draws the
  next one (`s.key`: one key, or per-row keys [B, 2])."""
  b, lc = s.canvas.shape
  rows = jnp.arange(b)
  live = ~s.done
  cur = plen + s.n_gen - 1  # position of the last token
  tokens = jnp.take_along_axis(s.canvas, cur[:, None], -1)
  mask = jnp.concatenate([s.cache.valid, jnp.ones((b, 1), bool)], -1)[:, None, :]
  logits, kv = fwd.apply(fwd.params, tokens, cur[:, None], mask, s.cache.kv, 0)
  cache = append(s.cache, kv, cur[:, None], live.astype(jnp.int32))
  key, tok, lp = _ar_draw(logits[:, 0], s.canvas, cur + 1, s.key, cfg)
  nxt = jnp.where(live, cur + 1, lc)  # dropped when not live
  canvas = s.canvas.at[rows, nxt].set(tok, mode="drop")
  logprob = s.logprob
  if cfg.rollout_stats:
    logprob = logprob.at[rows, nxt].set(lp, mode="drop")
  n_gen = s.n_gen + live.astype(jnp.int32)
  stopped = s.stopped | (live & (tok == cfg.eos_token_id)) if stop_eos else s.stopped
  return _ARState(
    canvas=canvas,
    cache=cache,
    n_gen=n_gen,
    done=s.done | (n_gen >= n) | stopped,
    calls=s.calls + live.astype(jnp.int32),
    stopped=stopped,
    key=key,
    logprob=logprob,
  )


def ar_start(fwd, prompt, plen, canvas, n, key, cfg: SamplerConfig, stop_eos: bool):
  """The prompt pass (one call) and the first token: the state before the first step.

  prompt int32 [B, Pmax] (left-aligned), plen int32 [B], canvas int32 [B, Lc], n: new tokens;
  key: one key, or per-row keys [B, 2]."""
  b, pmax = prompt.shape
  lc = canvas.shape[1]
  rows = jnp.arange(b)
  pos = jnp.broadcast_to(jnp.arange(pmax, dtype=jnp.int32), (b, pmax))
  cache, logits = prefill(fwd, prompt, pos, pos < plen[:, None], lc, want_logits=True)
  last = jnp.take_along_axis(logits, (plen - 1)[:, None, None], 1)[:, 0]
  key, tok, lp = _ar_draw(last, canvas, plen, key, cfg)
  canvas = canvas.at[rows, plen].set(tok)
  logprob = None
  if cfg.rollout_stats:
    logprob = jnp.zeros(canvas.shape, jnp.float32).at[rows, plen].set(lp)
  n_gen = jnp.ones((b,), jnp.int32)
  stopped = (tok == cfg.eos_token_id) if stop_eos else jnp.zeros((b,), bool)
  return _ARState(
    canvas=canvas,
    cache=cache,
    n_gen=n_gen,
    done=(n_gen >= n) | stopped,
    calls=jnp.ones((b,), jnp.int32),
    stopped=stopped,
    key=key,
    logprob=logprob,
  )


@functools.partial(jax.jit, static_argnames=("apply", "cfg", "stop_eos"))
def ar_core(apply, params, prompt, plen, canvas, n, key, *, cfg: SamplerConfig, stop_eos: bool):
  """n: int32 [] new tokens (an argument: the canvas [B, Lc] may be wider, `gen_width`)."""
  fwd = bind(apply, params)
  state = ar_start(fwd, prompt, plen, canvas, n, key, cfg, stop_eos)
  state = loop.until_done(lambda s: ar_step(fwd, s, plen, n, cfg, stop_eos), state)
  return ar_results(state, plen)


def ar_results(state: _ARState, plen) -> dict:
  """What `loop.ar_output` reads (commit steps and counts follow from n_gen)."""
  return dict(
    canvas=state.canvas,
    n_gen=state.n_gen,
    forward_calls=state.calls,
    stopped=state.stopped,
    plen=plen,
    token_logprob=state.logprob,
  )


def ar_generate(model, params, prompts, cfg: SamplerConfig, rng=None) -> SampleOutput:
  """Autoregressive decoding with a KV cache (SPEC §4.8, DiT path): N calls for N tokens."""
  n = cfg.max_new_tokens
  prompt, plen, canvas, target = prompt_arrays(prompts, cfg, n, gen_width(prompts, cfg, n))
  res = loop.run_on_mesh(
    model,
    params,
    rng,
    cfg,
    lambda fwd, place, key: ar_core(
      fwd.apply,
      fwd.params,
      *place((prompt, plen, canvas)),
      place(np.int32(n)),
      key,
      cfg=loop_cfg(cfg),
      stop_eos=cfg.stops_at_eos,
    ),
    ids=canvas,
  )
  return loop.ar_output(res, target, cfg, prompt.shape[1] + n)
