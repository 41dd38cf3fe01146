"""Fixed-capacity KV cache and the model adapter shared by every sampler (SPEC §3.8, §4.3).

The model protocol (`ApplyFn`):

    apply(params, tokens, positions, mask, kv_cache, head_start) -> (logits, kv)

    tokens, positions: int [B, S]; mask: bool [B, S, C + S] (keys = [cache | this call]);
    kv_cache: None or a pytree whose leaves hold C slots on axis `apply.kv_seq_axis` (default 1:
      [B, C, ...]; the backbones' adapter: 2, per layer (k, v) [B, H, C, Dh]);
    head_start: static int, logits are returned for rows [head_start:] only;
    logits: fp32 [B, S - head_start, V] (raw, M not yet suppressed);
    kv: the same pytree structure with S slots on that axis: this call's keys/values.

`as_forward(model, params)` accepts any registered backbone module (`DiT`, `Qwen3`; the adapter
calls its `decode_step`, `models.decode_step`), a `Forward`, or a plain `logits_fn(tokens,
positions, mask, kv_cache) -> (logits, kv)` (toy tests). `backbone_hidden_fn` is the same call
returning the hidden states that enter the head: the decode head below and `rl.scoring` read it.
The adapter functions are cached per model config / function, so jitted samplers compile once.

Decode-only head layout: for a backbone with `output_head(params)` (DiT, Qwen3),
`as_forward` (eagerly, once per params) or `bind` (inside a jitted sampler, before its loop) adds
a [V, D] copy of the head kernel (`DecodeParams`; the parameters themselves are unchanged).
Decoding feeds a few rows per step, where the head matmul reads the whole V x D kernel and is
memory-bound; XLA:CPU runs a few-row `h @ W` 1.5-1.7x faster from the [V, D] copy (one row: the
[D, V] original is faster and is used). Same math, same fp32 (only the summation order of a dot
product may differ). A head the params already store as [V, D] (Qwen3's tied embedding, via the
backbone's `head_vd(params)`) is used as it is, never copied.

The cache is shaped after the kv the model returns, so it holds what the backbone stores per layer:
H heads for the DiT, the KV heads only (K) for a grouped-query Qwen3 (`models.cache_layout(config)`
gives the same numbers from the config alone). A backbone's adapter asks for head-major kv
(`kv_layout="bhsd"`): the cache leaves are [B, H|K, C, Dh] (`KVCache.seq_axis` = 2), the layout
the cached attention reads without copying the cache (`attention.attend_cached`). With the
appends moved out of the samplers' `lax.switch` / `lax.cond` (XLA copied the cache written inside
a branch), CPU decoding at V = 4,096 ran 1.25x faster at batch 8 and 1.5-1.9x at batch 32
(benchmarks/README.md). Plain `logits_fn`s keep [B, C, ...] (`seq_axis` = 1).

The cache stores only committed clean tokens. It has a fixed capacity C per row and a per-row
length; slot j of row b is valid iff j < length[b]. `append` writes a call's first rows at the
row's length (`lax.dynamic_update_slice`, one row at a time via vmap) and advances the length by a
per-row count; the caller sizes C so that a write never runs past the end (no clamping).
On a mesh (`placement.on`), the cache leaves are pinned to batch over (data, fsdp) and heads over
`tensor` (`placement.constrain_kv`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp

from setdiff_jax import models
from setdiff_jax.diffusion import masks
from setdiff_jax.sampling import placement

ApplyFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Forward:
  """A model as the samplers see it: a hashable `apply` function plus its params."""

  apply: ApplyFn
  params: Any = None


@flax.struct.dataclass
class DecodeParams:
  """Backbone params plus a decode-only copy of the head kernel, head_vd [V, D] (module doc)."""

  params: Any
  head_vd: jax.Array


def _decode_logits(model, p: DecodeParams, h: jax.Array) -> jax.Array:
  """h [B, S, D] -> fp32 logits [B, S, V], as the head (compute dtype, then fp32)."""
  dt = jnp.dtype(getattr(model.config, "dtype", "float32"))
  kernel, bias = model.output_head(p.params)
  rows = h.reshape(-1, h.shape[-1]).astype(dt)
  if rows.shape[0] == 1:
    z = jnp.dot(rows, kernel.astype(dt))
  else:
    z = jnp.dot(rows, p.head_vd.astype(dt).T)
  if bias is not None:
    z = z + bias.astype(dt)
  return z.astype(jnp.float32).reshape(h.shape[:-1] + (z.shape[-1],))


@functools.lru_cache(maxsize=None)
def backbone_hidden_fn(config) -> ApplyFn:
  """The feature path of a backbone (DiT, Qwen3) with this config: apply(params, tokens,
  positions, mask, kv_cache, head_start) -> (hidden [B, S - head_start, D], kv), the hidden
  states that enter its head (`output_head`) and this call's head-major kv. The samplers' decode
  head and `rl.scoring` both read it."""
  model = models.build(config)

  def hidden(params, tokens, positions, mask, kv_cache, head_start=0):
    return models.decode_step(model, params, tokens, positions, mask, kv_cache, head_start, True)

  hidden.kv_seq_axis = 2
  return hidden


@functools.lru_cache(maxsize=None)
def backbone_apply_fn(config) -> ApplyFn:
  """The `ApplyFn` of a backbone (DiT, Qwen3) with this config (one function object per config)."""
  model = models.build(config)
  hidden = backbone_hidden_fn(config)

  def apply(params, tokens, positions, mask, kv_cache, head_start=0):
    if isinstance(params, DecodeParams):
      h, kv = hidden(params.params, tokens, positions, mask, kv_cache, head_start)
      return _decode_logits(model, params, h), kv
    return models.decode_step(model, params, tokens, positions, mask, kv_cache, head_start, False)

  apply.kv_seq_axis = 2  # head-major cache leaves [B, H, C, Dh] (module doc)
  apply.vocab_size = int(config.vocab_size)  # the ids it embeds: [0, V) (`vocab_size`)

  if hasattr(model, "output_head"):  # backbones that can hand over hidden states + head
    apply.head_kernel = lambda params: model.output_head(params)[0]
    apply.stored_head_vd = lambda params: _stored_head_vd(model, params)

    def prepare(params):
      stored = _stored_head_vd(model, params)
      if stored is not None:
        return DecodeParams(params, stored)
      # The barrier keeps XLA from folding the transpose back into the head dot.
      return DecodeParams(
        params, jax.lax.optimization_barrier(jnp.transpose(model.output_head(params)[0]))
      )

    apply.prepare = prepare
  return apply


def _stored_head_vd(model, params):
  """The head as the params already hold it in [V, D] (Qwen3's tied embedding), else None: no
  copy is made of a head that is stored that way."""
  head_vd = getattr(model, "head_vd", None)
  return None if head_vd is None else head_vd(params)


dit_apply_fn = backbone_apply_fn  # the historical name


def bind(apply: ApplyFn, params) -> "Forward":
  """`Forward(apply, params)` with the params prepared for decoding by `apply.prepare` if any.

  Call it inside the jitted sampler, before the loop: the preparation runs once per call.
  """
  prepare = getattr(apply, "prepare", None)
  if prepare is None or params is None or isinstance(params, DecodeParams):
    return Forward(apply, params)
  return Forward(apply, prepare(params))


_LAST_DECODE = []  # [(kernel, DecodeParams, params)]: the copy of the last concrete params


def decode_params(apply: ApplyFn, params):
  """Concrete params -> `DecodeParams`, made eagerly (outside any jit) and reused while the same
  params come back. An eager [V, D] array has the row-major layout the fast head dot needs; made
  inside a jitted sampler, XLA may lay the copy out as the original (a no-op)."""
  kernel_of = getattr(apply, "head_kernel", None)
  if kernel_of is None or params is None:
    return params
  kernel = kernel_of(params)
  if not isinstance(kernel, jax.Array) or isinstance(kernel, jax.core.Tracer):
    return params
  if _LAST_DECODE and _LAST_DECODE[0][0] is kernel and _LAST_DECODE[0][2] is params:
    return _LAST_DECODE[0][1]
  stored = apply.stored_head_vd(params)
  out = DecodeParams(params, jnp.transpose(kernel).copy() if stored is None else stored)
  _LAST_DECODE[:] = [(kernel, out, params)]
  return out


@functools.lru_cache(maxsize=None)
def logits_fn_apply(logits_fn: Callable) -> ApplyFn:
  """Wraps `logits_fn(tokens, positions, mask, kv_cache) -> (logits, kv)` as an `ApplyFn`."""

  def apply(params, tokens, positions, mask, kv_cache, head_start=0):
    del params
    logits, kv = logits_fn(tokens, positions, mask, kv_cache)
    return logits[:, head_start:].astype(jnp.float32), kv

  return apply


def apply_fn(model) -> ApplyFn:
  """The `ApplyFn` of a backbone module, a `Forward` or a plain logits function (raw params)."""
  if isinstance(model, Forward):
    return model.apply
  if models.is_backbone(model):
    return backbone_apply_fn(model.config)
  if callable(model):
    return logits_fn_apply(model)
  raise TypeError(
    f"expected a backbone, a Forward or a logits function, got {type(model).__name__}"
  )


def vocab_size(fwd: Forward) -> Optional[int]:
  """V of the backbone behind `fwd` (None for a plain logits function: unknown)."""
  return getattr(fwd.apply, "vocab_size", None)


@functools.lru_cache(maxsize=None)
def _expected_shapes(config) -> dict:
  """{parameter path: shape} of a backbone with this config (`jax.eval_shape`: no memory)."""
  leaves = jax.tree_util.tree_flatten_with_path(models.param_shapes(config))[0]
  return {jax.tree_util.keystr(path): tuple(x.shape) for path, x in leaves}


_LAST_CHECKED = []  # [(config, params)]: the last tree `check_params` accepted


def check_params(module, params) -> None:
  """ValueError unless `params` is the parameter tree of `module` (a backbone): Flax reads only
  the names a module asks for, so a deeper run's parameters would decode with their extra layers
  dropped, silently; a missing or mis-shaped leaf would fail deep inside the jitted loop."""
  if _LAST_CHECKED and _LAST_CHECKED[0][0] == module.config and _LAST_CHECKED[0][1] is params:
    return
  if not isinstance(params, dict) and not hasattr(params, "keys"):
    raise ValueError(f"params: expected the parameter tree (a dict), got {type(params).__name__}")
  if set(params.keys()) == {"params"}:
    raise ValueError(
      "params is a variables dict ({'params': ...}): pass variables['params'], the tree "
      "`models.init_params` and the checkpoints hold"
    )
  want = _expected_shapes(module.config)
  have = {
    jax.tree_util.keystr(path): tuple(getattr(x, "shape", ()))
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
  }
  name = type(module).__name__
  problems = [f"missing {p}" for p in sorted(want.keys() - have.keys())]
  problems += [f"unexpected {p}" for p in sorted(have.keys() - want.keys())]
  problems += [
    f"{p} has shape {have[p]}, the model expects {want[p]}"
    for p in sorted(want.keys() & have.keys())
    if have[p] != want[p]
  ]
  if problems:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise ValueError(
      f"the params do not fit this {name} ({module.config.num_layers} layers, vocab_size="
      f"{module.config.vocab_size}): {'; '.join(problems[:3])}{more}; build the model from "
      "the config the params were trained with"
    )
  _LAST_CHECKED[:] = [(module.config, params)]


def as_forward(model, params=None) -> Forward:
  """A backbone module + params, a `Forward`, or a plain logits function -> `Forward` (a
  backbone's params with the decode-only head copy, `decode_params`). A backbone's params are
  checked against its config first (`check_params`)."""
  if isinstance(model, Forward):
    return model
  if models.is_backbone(model):
    if params is None:
      raise ValueError(f"a {type(model).__name__} needs its params")
    check_params(model, params)
  apply = apply_fn(model)
  return Forward(apply, decode_params(apply, params))


@flax.struct.dataclass
class KVCache:
  """kv: pytree with leaves [B, ..., C, ...] (C slots on axis `seq_axis`: 1 for [B, C, ...], 2 for
  the backbones' head-major [B, H, C, Dh]); positions: int32 [B, C]; length: int32 [B]."""

  kv: Any
  positions: jax.Array
  length: jax.Array
  seq_axis: int = flax.struct.field(pytree_node=False, default=1)

  @property
  def capacity(self) -> int:
    return self.positions.shape[1]

  @property
  def valid(self) -> jax.Array:
    """bool [B, C]: slots holding committed tokens."""
    return jnp.arange(self.capacity)[None, :] < self.length[:, None]


def empty_cache(kv_like, capacity: int, seq_axis: int = 1) -> KVCache:
  """Zero cache shaped after `kv_like` (leaves with S slots on `seq_axis`) with C = capacity."""
  if seq_axis < 1:
    raise ValueError(f"seq_axis must be >= 1 (axis 0 is the batch), got {seq_axis}")
  leaves = jax.tree_util.tree_leaves(kv_like)
  batch = leaves[0].shape[0]

  def zeros(x):
    shape = list(x.shape)
    shape[0], shape[seq_axis] = batch, capacity
    return jnp.zeros(shape, x.dtype)

  return KVCache(
    kv=jax.tree_util.tree_map(lambda x: placement.constrain_kv(zeros(x), seq_axis), kv_like),
    positions=jnp.zeros((batch, capacity), jnp.int32),
    length=jnp.zeros((batch,), jnp.int32),
    seq_axis=seq_axis,
  )


def _write_rows(buf, new, start, axis: int = 1):
  """buf [B, ..., C, ...] <- new [B, ..., S, ...] (slots on `axis`) at per-row offsets start [B]."""
  if buf.shape[0] == 1:  # one row: a plain in-place update (vmap would lower to a scatter)
    idx = [0] * buf.ndim
    idx[axis] = start[0]
    return jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), tuple(idx))

  def one(b, n, s):
    idx = [0] * b.ndim
    idx[axis - 1] = s
    return jax.lax.dynamic_update_slice(b, n.astype(b.dtype), tuple(idx))

  return jax.vmap(one)(buf, new, start)


def cache_seq_axis(fwd: Forward) -> int:
  """The slot axis of the kv leaves `fwd.apply` takes and returns (module doc)."""
  return getattr(fwd.apply, "kv_seq_axis", 1)


def append(
  cache: KVCache, kv, positions: jax.Array, count: jax.Array, num_rows: Optional[int] = None
) -> KVCache:
  """Appends the first `count[b]` slots of `kv` (leaves with S slots on `cache.seq_axis`) to each
  row's cache.

  Only slots [0, num_rows) of the call are written (default all S); the slots written past
  `count[b]` hold junk and stay invalid (the length advances by `count`).
  """
  axis = cache.seq_axis
  take = lambda x, a: x if num_rows is None else jax.lax.slice_in_dim(x, 0, num_rows, axis=a)
  start = cache.length
  new_kv = jax.tree_util.tree_map(
    lambda buf, x: placement.constrain_kv(_write_rows(buf, take(x, axis), start, axis), axis),
    cache.kv,
    kv,
  )
  new_pos = _write_rows(cache.positions, take(positions, 1).astype(jnp.int32), start)
  return cache.replace(kv=new_kv, positions=new_pos, length=cache.length + count.astype(jnp.int32))


def prefill(
  fwd: Forward, tokens, positions, valid, capacity: int, mask=None, want_logits: bool = False
):
  """Encodes context tokens into a fresh cache (one model call).

  tokens, positions: int [B, S] in cache order; valid: bool [B, S], a prefix of each row.
  mask: bool [B, S, S] (default clean-causal in slot order).
  Returns (cache, logits): logits fp32 [B, S, V] if want_logits, else [B, 0, V] (head skipped).
  """
  if mask is None:
    mask = masks.causal_valid_mask(valid)
  head_start = 0 if want_logits else tokens.shape[1]
  logits, kv = fwd.apply(fwd.params, tokens, positions, mask, None, head_start)
  cache = empty_cache(kv, capacity, cache_seq_axis(fwd))
  cache = append(cache, kv, positions, jnp.sum(valid, -1).astype(jnp.int32))
  return cache, logits


__all__ = [
  "ApplyFn",
  "Forward",
  "KVCache",
  "DecodeParams",
  "bind",
  "decode_params",
  "backbone_apply_fn",
  "backbone_hidden_fn",
  "apply_fn",
  "dit_apply_fn",
  "logits_fn_apply",
  "as_forward",
  "empty_cache",
  "cache_seq_axis",
  "append",
  "prefill",
]
