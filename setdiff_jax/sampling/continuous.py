"""Continuous batching: a fixed number of decoding slots, refilled inside one jitted loop.

  out = continuous_generate("set", model, params, prompts, cfg, rng, slots=32)  # or "causal" (AR)
  out.result            # SampleOutput, rows in input order
  out.counters          # decode_steps, prefill_calls, live_slot_steps, slots, ...

Static batches (`set_generate` / `ar_generate` over chunks of B prompts) run each batch until its
slowest row ends; rows that end early idle in their slot. Here each of S slots holds its own row:
its own prompt, KV-cache row, step counter, RNG stream and policy state. One `lax.while_loop`
iteration is:

  load    when at least min(K, rows left) slots are free (K = `refill`, static), the next rows in
          input order are prefilled into the first free slots (one prompt-encoding call on K rows,
          `set_sampler.set_init` / `ar_sampler.ar_start`, under a `lax.cond`: no call when
          nothing is loaded; the slots' cache rows are overwritten outside the cond, so the big
          cache is never copied by a branch);
  step    one decoding step of every slot (`set_sampler.cached_forward` + `advance`,
          `ar_sampler.ar_step`: the static samplers' own step code); free slots ride along
          masked (they are the idle slot-steps the counters report);
  harvest rows that ended this step (EOS, budget, no mask left) are written to the output
          buffers at their input index and their slots become free.

Per-row RNG: row r draws from key_r = fold_in(key, id_r), id_r = row_ids[r] (default r; a caller
such as the lm_eval adapter passes ids of its own so that a row's draw does not depend on its
position in the call): the slots' state holds per-row keys
[S, 2], which the samplers' own step code splits row by row (`processors.split_key`) and draws
from with a batch of one per row (`processors.choose`). So row r's tokens, commit steps and
log-probabilities are those of decoding prompt r alone (batch 1) with rng = key_r, independent of
its slot and of its neighbours (tests/test_continuous.py), up to float rounding: the model runs at
the slots' batch and canvas shapes, whose reductions may round the logits otherwise in the last
bits (log-probs ~1e-6 apart), which can flip a near-tie (seen under a sampled entropy_bound policy
on a trained model). Greedy decoding ignores the key: the rows then equal the static batches' rows
too, up to the same rounding (static batches share one key per batch, so sampled rows differ).

Shapes are fixed per call: S slots, K refill rows, the canvas width (longest bucketed prompt +
the largest budget), rows padded to a power of two (`n_rows` is an argument): one compiled
program per (config, slots, refill, width bucket, row bucket); `compiled_programs()` counts them.
Supported: the set sampler (prompted, 'l2r' cache order) and AR. BD3LM's block loop
is not on this scaffold.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.sampling import ar_sampler, loop, placement, set_sampler
from setdiff_jax.sampling.baselines import loop_cfg, prompt_arrays
from setdiff_jax.sampling.cache import KVCache, as_forward, bind, vocab_size
from setdiff_jax.sampling.config import SampleOutput, SamplerConfig, bucket_length
from setdiff_jax.sampling.set_inputs import (
  SetInputs,
  _as_rows,
  build_inputs,
  check_prompts,
  check_vocab,
  prompt_width,
)

KINDS = ("set", "causal")  # the set sampler, the causal (AR) loop


def unsupported(kind: Optional[str], cfg: SamplerConfig) -> Optional[str]:
  """Why continuous batching cannot decode with this sampler / config (None: it can)."""
  if kind not in KINDS:
    return f"continuous batching covers the set sampler and AR only: kind is one of {KINDS}"
  if kind == "set" and cfg.cache_order != "l2r":
    return (
      "cache_order='fht' draws each batch's cache order from its rows' positions in the batch; "
      "continuous batching supports cache_order='l2r'"
    )
  return None


# ----------------------------------------------------------------------------- the slot loop
@flax.struct.dataclass
class Slots:
  """Loop state. state: the sampler's state over S slots; extra: the per-slot inputs the step
  reads (set: SetInputs [S, ...]; AR: (plen [S], n [S])); row int32 [S] (the row a slot holds);
  free bool [S] (no unharvested row); out: output buffers [R, ...] by input row."""

  state: Any
  extra: Any
  row: jax.Array
  free: jax.Array
  next_row: jax.Array  # int32 []
  out: Dict[str, jax.Array]
  decode_steps: jax.Array  # int32 []
  prefill_calls: jax.Array  # int32 []
  live_slot_steps: jax.Array  # int32 []


def _gather(tree, idx):
  return jax.tree_util.tree_map(lambda x: x[idx], tree)


def _scatter(tree, new, dest):
  """Rows dest [K] of every leaf [S, ...] replaced by new [K, ...] (dest = S: dropped)."""
  return jax.tree_util.tree_map(
    lambda x, y: x.at[dest].set(y.astype(x.dtype), mode="drop"), tree, new
  )


def _row_keys(key, rows):
  return jax.vmap(lambda r: jax.random.fold_in(key, r))(rows)


def _shard_cache(state):
  """The slots' KV cache pinned like the static samplers' (slots over data x fsdp, heads over
  tensor; `placement.constrain_kv`; identity off a mesh)."""

  def pin(c):
    if not isinstance(c, KVCache):
      return c
    return c.replace(
      kv=jax.tree_util.tree_map(lambda x: placement.constrain_kv(x, c.seq_axis), c.kv)
    )

  return jax.tree_util.tree_map(pin, state, is_leaf=lambda x: isinstance(x, KVCache))


def _run_slots(
  rows_in, n_rows, ids, key, *, slots: int, refill: int, start, step, extra_of, outputs
):
  """The loop (module doc). rows_in: every row's inputs [R, ...]; ids: uint32 [R], row r's key
  is fold_in(key, ids[r]); start(inputs [K], keys [K]) ->
  fresh sampler state [K]; step(state, extra) -> state; extra_of(inputs) -> per-slot extra;
  outputs(state) -> dict of [S, ...] arrays written when a row ends."""
  n_pad = jax.tree_util.tree_leaves(rows_in)[0].shape[0]
  k = refill
  shape_k = jax.eval_shape(
    start, _gather(rows_in, jnp.zeros((k,), jnp.int32)), _row_keys(key, jnp.zeros((k,), jnp.int32))
  )
  zeros = lambda shapes, n: jax.tree_util.tree_map(
    lambda s: jnp.zeros((n,) + s.shape[1:], s.dtype), shapes
  )
  state0 = _shard_cache(zeros(shape_k, slots).replace(done=jnp.ones((slots,), bool)))
  out0 = {
    name: jnp.zeros((n_pad,) + s.shape[1:], s.dtype)
    for name, s in jax.eval_shape(outputs, shape_k).items()
    if s is not None  # token_logprob without SamplerConfig.rollout_stats
  }
  extra0 = extra_of(_gather(rows_in, jnp.zeros((slots,), jnp.int32)))
  zero = jnp.zeros((), jnp.int32)
  c0 = Slots(
    state0,
    extra0,
    jnp.zeros((slots,), jnp.int32),
    jnp.ones((slots,), bool),
    zero,
    out0,
    zero,
    zero,
    zero,
  )

  def load(c: Slots) -> Slots:
    n_free = jnp.sum(c.free).astype(jnp.int32)
    left = n_rows - c.next_row
    n_load = jnp.where(n_free >= jnp.minimum(k, left), jnp.minimum(jnp.minimum(n_free, left), k), 0)
    j = jnp.arange(k)
    first_free = jnp.argsort(~c.free, stable=True)[:k].astype(jnp.int32)
    dest = jnp.where(j < n_load, first_free, slots)
    rows = jnp.minimum(c.next_row + j, n_pad - 1)
    inputs = _gather(rows_in, rows)
    fresh = jax.lax.cond(
      n_load > 0, lambda: start(inputs, _row_keys(key, ids[rows])), lambda: zeros(shape_k, k)
    )
    return c.replace(
      state=_scatter(c.state, fresh, dest),
      extra=_scatter(c.extra, extra_of(inputs), dest),
      row=c.row.at[dest].set(rows, mode="drop"),
      free=c.free.at[dest].set(False, mode="drop"),
      next_row=c.next_row + n_load,
      prefill_calls=c.prefill_calls + (n_load > 0).astype(jnp.int32),
    )

  def body(c: Slots) -> Slots:
    c = load(c)
    live = jnp.sum(~c.state.done).astype(jnp.int32)
    state = step(c.state, c.extra)
    ended = state.done & ~c.free
    dest = jnp.where(ended, c.row, n_pad)
    out = {
      name: c.out[name].at[dest].set(v, mode="drop")
      for name, v in outputs(state).items()
      if v is not None
    }
    return c.replace(
      state=state,
      out=out,
      free=c.free | state.done,
      decode_steps=c.decode_steps + 1,
      live_slot_steps=c.live_slot_steps + live,
    )

  c = jax.lax.while_loop(lambda c: (c.next_row < n_rows) | jnp.any(~c.free), body, c0)
  counters = dict(
    decode_steps=c.decode_steps, prefill_calls=c.prefill_calls, live_slot_steps=c.live_slot_steps
  )
  return c.out, counters


# ----------------------------------------------------------------------------- the samplers
@functools.partial(
  jax.jit, static_argnames=("apply", "cfg", "stop_eos", "history", "slots", "refill")
)
def _set_slots_core(
  apply, params, rows_in: SetInputs, n_rows, ids, key, *, cfg, stop_eos, history, slots, refill
):
  fwd = bind(apply, params)

  def start(inp, keys):
    return set_sampler.set_init(fwd, inp, cfg.window, keys, cfg.rollout_stats)

  def step(st, inp):
    win = set_sampler.step_window(st, inp, cfg)
    logits, model = set_sampler.cached_forward(fwd, st, cfg, win)
    return set_sampler.advance(
      st, inp, cfg, win, logits, model, stop_eos=stop_eos, history=history
    )[0]

  return _run_slots(
    rows_in,
    n_rows,
    ids,
    key,
    slots=slots,
    refill=refill,
    start=start,
    step=step,
    extra_of=lambda inp: inp,
    outputs=loop.results,
  )


@functools.partial(jax.jit, static_argnames=("apply", "cfg", "stop_eos", "slots", "refill"))
def _ar_slots_core(apply, params, rows_in, n_rows, ids, key, *, cfg, stop_eos, slots, refill):
  fwd = bind(apply, params)

  def start(inp, keys):
    prompt, plen, canvas, n = inp
    return ar_sampler.ar_start(fwd, prompt, plen, canvas, n, keys, cfg, stop_eos)

  def step(st, extra):
    plen, n = extra
    return ar_sampler.ar_step(fwd, st, plen, n, cfg, stop_eos)

  return _run_slots(
    rows_in,
    n_rows,
    ids,
    key,
    slots=slots,
    refill=refill,
    start=start,
    step=step,
    extra_of=lambda inp: (inp[1], inp[3]),
    outputs=lambda st: ar_sampler.ar_results(st, None),
  )


LOOPS = (_set_slots_core, _ar_slots_core)


# ----------------------------------------------------------------------------- host side
@dataclasses.dataclass
class ContinuousOutput:
  """result: the SampleOutput of every row, in input order. counters: decode_steps (loop
  iterations, one batched step call each), prefill_calls (prompt-encoding calls of `refill`
  rows), live_slot_steps (slot-steps that decoded a live row: the sum of the rows' steps), slots,
  refill, utilisation = live_slot_steps / (slots * decode_steps), forward_calls = decode_steps
  + prefill_calls."""

  result: SampleOutput
  counters: Dict[str, Any]


def _budgets(rows, cfg: SamplerConfig, budgets) -> np.ndarray:
  """Per-row new-token budgets int32 [R] (default cfg.max_new_tokens each): whole numbers >= 1,
  never cut (2.9 would decode 2 tokens)."""
  n = np.full(len(rows), cfg.max_new_tokens, np.int64) if budgets is None else np.asarray(budgets)
  if n.shape != (len(rows),) or n.dtype.kind not in "iuf" or np.any(n < 1):
    raise ValueError(
      f"budgets: expected {len(rows)} per-row token budgets >= 1, got {np.asarray(budgets)!r}"
    )
  if np.any(n != np.round(n)):
    raise ValueError(f"budgets: token budgets are whole numbers, got {n.tolist()}")
  return n.astype(np.int32)


def set_rows(prompts, cfg: SamplerConfig, budgets=None, width: Optional[int] = None) -> SetInputs:
  """Every row's set-sampler inputs, one shared width: prompt ++ [M] * N_r (N_r = the row's
  budget, default cfg.max_new_tokens); width (default) = the bucketed longest prompt + the
  largest N_r."""
  rows = _as_rows(prompts, "prompts")
  n = _budgets(rows, cfg, budgets)
  check_prompts(rows, cfg, n, per_row=budgets is not None)  # each row against its own budget
  canvases = [np.concatenate([p, np.full(b, cfg.mask_token_id)]) for p, b in zip(rows, n)]
  targets = [np.arange(len(p) + b) >= len(p) for p, b in zip(rows, n)]
  if width is None:
    width = prompt_width(rows, cfg.replace(max_new_tokens=int(n.max()))) + int(n.max())
  return build_inputs(canvases, targets, cfg, cfg.seed, width=width)


def ar_rows(prompts, cfg: SamplerConfig, budgets=None, width: Optional[int] = None):
  """Every row's AR inputs: (prompt [R, Pmax], plen [R], canvas [R, Lc], n [R]) and target;
  Lc = the bucketed longest prompt + the largest budget, or `width` if wider."""
  rows = _as_rows(prompts, "prompts")
  n = _budgets(rows, cfg, budgets)
  check_prompts(rows, cfg, n, per_row=budgets is not None)  # each row: its own budget
  prompt, plen, canvas, target = prompt_arrays(
    rows, cfg.replace(max_new_tokens=int(n.max()), max_length=None), int(n.max()), width
  )
  target &= (np.arange(target.shape[1])[None] - plen[:, None]) < n[:, None]
  return (prompt, plen, canvas, n), target


def _row_ids(row_ids, n_rows: int) -> np.ndarray:
  """The rows' key ids uint32 [R] (default 0..R-1): integers in [0, 2**32), never wrapped
  (fold_in reads 32 bits, so 2**32 + r would silently draw row r's stream)."""
  if row_ids is None:
    return np.arange(n_rows, dtype=np.uint32)
  ids = np.asarray(row_ids)
  bad = ids.shape != (n_rows,) or (ids.size and ids.dtype.kind not in "iu")
  if bad or np.any(ids < 0) or np.any(ids > np.iinfo(np.uint32).max):
    raise ValueError(
      f"row_ids: expected {n_rows} integers in [0, 2**32), one per row, got {row_ids!r}"
    )
  return ids.astype(np.uint32)


def _pad_rows(tree, n_pad: int):
  def pad(x):
    x = np.asarray(x)
    return np.concatenate([x, np.repeat(x[:1], n_pad - len(x), 0)]) if n_pad > len(x) else x

  return jax.tree_util.tree_map(pad, tree)


def continuous_generate(
  kind: str,
  model,
  params,
  prompts,
  cfg: SamplerConfig,
  rng=None,
  *,
  slots: int = 32,
  refill: Optional[int] = None,
  budgets: Optional[Sequence[int]] = None,
  row_ids: Optional[Sequence[int]] = None,
) -> ContinuousOutput:
  """Decodes every prompt with `slots` continuously refilled slots (module doc).

  kind: 'set' (the SetDLM sampler) or 'causal' (AR). rng: the base key (default PRNGKey(cfg.seed));
  row r draws from fold_in(rng, row_ids[r]). refill: rows per prompt-encoding call (default
  max(1, slots // 8)). budgets: per-row max new tokens (default cfg.max_new_tokens each).
  row_ids: one integer in [0, 2**32) per row (default 0, 1, ..., R - 1): row r's tokens are
  those of decoding it alone with rng = fold_in(rng, row_ids[r]), whatever its position; equal
  ids give equal streams (greedy rows never read the key).
  """
  why = unsupported(kind, cfg)
  if why is not None:
    raise ValueError(f"continuous batching with sampler {kind!r}: {why}")
  if slots < 1:
    raise ValueError(f"slots={slots}: need at least one decoding slot")
  refill = max(1, slots // 8) if refill is None else int(refill)
  if not 1 <= refill <= slots:
    raise ValueError(f"refill={refill} must be in [1, slots={slots}]")
  rows = _as_rows(prompts, "prompts")
  n_rows = len(rows)
  n_pad = max(bucket_length(n_rows, "pow2"), slots)
  ids = _pad_rows(_row_ids(row_ids, n_rows), n_pad)
  fwd = as_forward(model, params)
  key = loop.key_of(rng, cfg)
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):  # a typed key: its data, uint32 [2]
    key = jax.random.key_data(key)
  static = loop_cfg(cfg)
  mesh = placement.mesh_of(fwd.params)
  if kind == "set":
    inp = set_rows(rows, cfg, budgets)
    check_vocab(inp.canvas, cfg, vocab_size(fwd))
    history = "generated" if cfg.penalty_history == "auto" else cfg.penalty_history
    core = functools.partial(
      _set_slots_core, cfg=static, stop_eos=cfg.stops_at_eos, history=history
    )
    rows_in = _pad_rows(inp, n_pad)
  else:
    rows_in, target = ar_rows(rows, cfg, budgets)
    check_vocab(rows_in[2], cfg, vocab_size(fwd))
    core = functools.partial(_ar_slots_core, cfg=static, stop_eos=cfg.stops_at_eos)
    rows_in = _pad_rows(rows_in, n_pad)
  with placement.on(mesh):
    out, counters = core(
      fwd.apply,
      fwd.params,
      placement.place_rows(mesh, rows_in),
      np.int32(n_rows),
      ids,
      key,
      slots=slots,
      refill=refill,
    )
  out = {name: v[:n_rows] for name, v in placement.to_host(out).items()}
  counters = {name: int(v) for name, v in placement.to_host(counters).items()}
  if kind == "set":
    result = loop.set_output(out, inp, cfg)
  else:
    out["plen"] = np.asarray(rows_in[1])[:n_rows]
    result = loop.ar_output(out, target[:n_rows], cfg)
  counters.update(
    slots=slots,
    refill=refill,
    rows=n_rows,
    forward_calls=counters["decode_steps"] + counters["prefill_calls"],
    utilisation=counters["live_slot_steps"] / max(slots * counters["decode_steps"], 1),
  )
  return ContinuousOutput(result, counters)


__all__ = ["KINDS", "unsupported", "ContinuousOutput", "continuous_generate", "set_rows", "ar_rows"]
