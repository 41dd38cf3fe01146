"""Attention implementations behind one signature.

`attend(q, k, v, mask, implementation)`:
  q: [B, Sq, H, Dh], k, v: [B, Sk, H, Dh], mask: bool [B, Sq, Sk] or [B, 1, Sq, Sk] (True = attend),
  or a `TiledMask` (the same dense mask plus the static tile structure of its fixed part).
  Returns [B, Sq, H, Dh] in q's dtype.

- `dense`: explicit einsum with fp32 softmax; masked scores are set to float32 min (finite, so a
  fully masked row gives a uniform softmax instead of NaN, as the reference's SDPA additive mask).
  The reference for tests and CPU.
- `xla` / `cudnn`: `jax.nn.dot_product_attention` (fused kernels on GPU with `cudnn`).
- `blocksparse`: pure JAX, tile by tile: each query tile attends to the key tiles its static mask
  needs (known at trace time), concatenated; empty tiles are never computed. Same outputs as
  dense (a fully masked query row still gets the uniform average over all keys).
- `splash`: the Pallas splash-attention kernel (TPU; `interpret=True` elsewhere, for tests) with
  the static mask as a `NumpyMask` and the padding as segment ids; on a backend without the
  kernel it falls back to `blocksparse`.
A plain array mask (no tile structure: decoding steps, caches) always takes the dense path under
`blocksparse` / `splash`. Under a context mesh (`jax.set_mesh`) both tiled paths run per device
under `jax.shard_map` (`per_shard`): batch over `data` x `fsdp`, heads over `tensor` (each axis
only when it divides), so the kernel never sees the mesh and nothing is gathered.

`attend_cached(q, k, v, past_k, past_v, mask, implementation)` is a cached decoding step: the new
slots' q, k, v [B, S, H|K, Dh] plus a cache in `KV_LAYOUTS` layout. With a head-major cache
([B, K, C, Dh], the samplers' layout) the dense path never concatenates the cache with the new
keys and never transposes it: scores over the cache and over the new slots are two batched dots
joined by one softmax (on CPU the [B, C, H, Dh] concatenation and the transpose XLA inserts for
the dot copied the whole cache in every layer of every step). K < H (grouped-query attention)
groups the query heads per KV head instead of repeating the cache.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("dense", "xla", "cudnn", "blocksparse", "splash")
# A KV cache's axis order: "bshd" [B, C, K, Dh] (the backbones' default, as the reference) or
# "bhsd" [B, K, C, Dh] (head-major: what the cached dense attention reads without a copy).
KV_LAYOUTS = ("bshd", "bhsd")
TILED = ("blocksparse", "splash")


def _as_4d(mask: jax.Array) -> jax.Array:
  return mask[:, None] if mask.ndim == 3 else mask


class StaticPattern:
  """A hashable static bool mask [Sq, Sk] (compared by value), for pytree aux data."""

  def __init__(self, mask: np.ndarray):
    self.mask = np.ascontiguousarray(np.asarray(mask, bool))
    self._key = (self.mask.shape, self.mask.tobytes())

  def __hash__(self):
    return hash(self._key)

  def __eq__(self, other):
    return isinstance(other, StaticPattern) and self._key == other._key

  def tiles(self, tile: int) -> np.ndarray:
    """bool [Sq / tile, Sk / tile]: tiles holding at least one True."""
    sq, sk = self.mask.shape
    return self.mask.reshape(sq // tile, tile, sk // tile, tile).any(axis=(1, 3))


@jax.tree_util.register_pytree_node_class
class TiledMask:
  """dense: bool [B, Sq, Sk] (or [B, 1, Sq, Sk]) = static & padding; static: its fixed part.

  Contract: `dense` is False wherever `static` is (e.g. `static[None] & padding_mask(valid)`).
  """

  def __init__(self, dense, static: StaticPattern):
    self.dense = dense
    self.static = static

  @property
  def shape(self):
    return self.dense.shape

  @property
  def ndim(self):
    return self.dense.ndim

  def tree_flatten(self):
    return (self.dense,), self.static

  @classmethod
  def tree_unflatten(cls, static, children):
    return cls(children[0], static)


def with_tiles(mask, static: np.ndarray, implementation: str):
  """`mask` wrapped with its static part when `implementation` uses tiles, else unchanged."""
  if implementation not in TILED:
    return mask
  return TiledMask(mask, StaticPattern(static))


def for_model(model, mask, static: np.ndarray):
  """`with_tiles` with the attention implementation of `model.config` (plain mask if none)."""
  impl = getattr(getattr(model, "config", None), "attention", "dense")
  return with_tiles(mask, static, impl)


def default_tile(length: int) -> int:
  """Tile width: a power of two with about 8 tiles per side, 16..128, dividing `length`."""
  tile = 16
  while tile < 128 and length % (2 * tile) == 0 and length // (2 * tile) >= 8:
    tile *= 2
  return tile if length % tile == 0 else length


def dense_attention(q, k, v, mask):
  scale = q.shape[-1] ** -0.5
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(_as_4d(mask), scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def check_kv_layout(kv_layout: str):
  if kv_layout not in KV_LAYOUTS:
    raise ValueError(f"unknown kv_layout {kv_layout!r}; use one of {KV_LAYOUTS}")


def to_kv_layout(x: jax.Array, kv_layout: str) -> jax.Array:
  """[B, S, K, Dh] -> the layout's axis order."""
  check_kv_layout(kv_layout)
  return x if kv_layout == "bshd" else jnp.swapaxes(x, 1, 2)


def _grouped_cached_dense(q, k, v, past_k, past_v, mask):
  """q [B, S, H, Dh]; k, v [B, S, K, Dh]; past_k, past_v [B, K, C, Dh] -> [B, S, H, Dh].

  Each dot is written in XLA's canonical order (batch, lhs rows, rhs columns) with the G = H / K
  query heads of a KV head and the S slots merged into one row axis: given another order XLA:CPU
  picked the cache as the left operand of the PV product, a far slower dot.
  """
  b, s, h, dh = q.shape
  kh, c = past_k.shape[1], past_k.shape[2]
  g = h // kh  # query head j reads KV head j // G
  rows = q.reshape(b, s, kh, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * s, dh)
  kn, vn = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # new slots only: [B, K, S, Dh]
  f32 = jnp.float32
  scores = jnp.concatenate(
    [
      jnp.einsum("bkxd,bkcd->bkxc", rows, past_k.astype(q.dtype), preferred_element_type=f32),
      jnp.einsum("bkxd,bktd->bkxt", rows, kn, preferred_element_type=f32),
    ],
    -1,
  )
  scores = scores.reshape(b, h, s, c + s) * dh**-0.5
  scores = jnp.where(_as_4d(mask), scores, jnp.finfo(f32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kh, g * s, c + s)
  out = jnp.einsum("bkxc,bkcd->bkxd", probs[..., :c], past_v.astype(v.dtype)) + jnp.einsum(
    "bkxt,bktd->bkxd", probs[..., c:], vn
  )
  return out.reshape(b, kh, g, s, dh).transpose(0, 3, 1, 2, 4).reshape(b, s, h, dh)


def attend_cached(
  q, k, v, past_k, past_v, mask, implementation: str = "dense", kv_layout: str = "bshd"
):
  """One cached step (module doc): q [B, S, H, Dh]; k, v [B, S, K, Dh] (this call's slots);
  past_k, past_v: the cache in `kv_layout`; mask bool [B, S, C + S] (cache keys first).
  Returns [B, S, H, Dh]."""
  check_kv_layout(kv_layout)
  h, kh = q.shape[2], k.shape[2]
  if h % kh:
    raise ValueError(f"{h} query heads do not group over {kh} KV heads")
  if kv_layout == "bhsd" and implementation in ("dense", "blocksparse", "splash"):
    return _grouped_cached_dense(q, k, v, past_k, past_v, mask)
  if kv_layout == "bhsd":
    past_k, past_v = jnp.swapaxes(past_k, 1, 2), jnp.swapaxes(past_v, 1, 2)
  k = jnp.concatenate([past_k.astype(k.dtype), k], axis=1)
  v = jnp.concatenate([past_v.astype(v.dtype), v], axis=1)
  if h != kh:  # as HF `repeat_kv`
    k, v = jnp.repeat(k, h // kh, axis=2), jnp.repeat(v, h // kh, axis=2)
  return attend(q, k, v, mask, implementation)


def blocksparse_attention(q, k, v, mask: TiledMask, tile: Optional[int] = None):
  """Dense attention restricted, per query tile, to the key tiles the static mask needs."""
  sq, sk = q.shape[1], k.shape[1]
  if mask.static.mask.shape != (sq, sk):
    return dense_attention(q, k, v, mask.dense)
  tile = tile or default_tile(min(sq, sk))
  if sq % tile or sk % tile:
    return dense_attention(q, k, v, mask.dense)
  dense = _as_4d(mask.dense)
  need = mask.static.tiles(tile)
  mean_v = None
  outs = []
  for i in range(sq // tile):
    rows = slice(i * tile, (i + 1) * tile)
    js = np.nonzero(need[i])[0]
    if len(js) == 0:
      js = np.arange(sk // tile)  # nothing to attend: the dense path's uniform rows
    cols = np.concatenate([np.arange(j * tile, (j + 1) * tile) for j in js])
    contiguous = np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols)))
    pick = (
      (lambda x, ax: jax.lax.slice_in_dim(x, int(cols[0]), int(cols[-1]) + 1, axis=ax))
      if contiguous
      else (lambda x, ax: jnp.take(x, cols, axis=ax))
    )
    m = pick(dense[:, :, rows], 3)
    o = dense_attention(q[:, rows], pick(k, 1), pick(v, 1), m)
    if len(cols) < sk:  # a fully masked row averages every key in the dense path
      if mean_v is None:
        mean_v = jnp.mean(v.astype(jnp.float32), axis=1, keepdims=True).astype(o.dtype)
      empty = ~jnp.any(m, axis=-1)  # [B, 1|H, tile]
      o = jnp.where(jnp.moveaxis(empty, 1, 2)[..., None], mean_v, o)
    outs.append(o)
  return jnp.concatenate(outs, axis=1)


@functools.lru_cache(maxsize=16)
def _splash_kernel(static: StaticPattern, num_heads: int, block: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu import splash_attention as sa

  mk = sa.MultiHeadMask([sa.NumpyMask(static.mask)] * num_heads)
  sizes = sa.BlockSizes(
    block_q=block,
    block_kv=block,
    block_kv_compute=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_kv_dkv_compute=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  return sa.make_splash_mha(
    mk, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret
  )


def splash_attention(q, k, v, mask: TiledMask, interpret: Optional[bool] = None):
  """Splash kernel: static mask + padding as segment ids (valid = attends / is attended)."""
  sq, sk = q.shape[1], k.shape[1]
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
    if interpret:  # no kernel on this backend: the pure-JAX tiled path
      return blocksparse_attention(q, k, v, mask)
  block = 128
  if mask.static.mask.shape != (sq, sk) or sq % block or sk % block:
    return blocksparse_attention(q, k, v, mask)
  from jax.experimental.pallas.ops.tpu import splash_attention as sa

  dense = _as_4d(mask.dense)[:, 0]  # [B, Sq, Sk]; the padding is the same for every head
  # Under the TiledMask contract dense = static & valid_q valid_k^T, so segment ids 1 (valid) /
  # 0 (padding) reproduce it for every valid query; padded queries' outputs are never read.
  q_seg = jnp.any(dense, axis=-1).astype(jnp.int32)
  k_seg = jnp.any(dense, axis=-2).astype(jnp.int32)
  kernel = _splash_kernel(mask.static, q.shape[2], block, bool(interpret))
  scale = q.shape[-1] ** -0.5
  to_hsd = lambda x: jnp.swapaxes(x, 1, 2)  # [B, S, H, Dh] -> [B, H, S, Dh]
  run = lambda qb, kb, vb, qs, ks: kernel(qb, kb, vb, segment_ids=sa.SegmentIds(q=qs, kv=ks))
  out = jax.vmap(run)(to_hsd(q * scale), to_hsd(k), to_hsd(v), q_seg, k_seg)
  out = jnp.where(q_seg[:, None, :, None] > 0, out, 0.0)  # padded queries: never read, kept finite
  return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def _mesh_split(q, k, mask):
  """(batch axes, head axis) of the context mesh (`jax.set_mesh`) that split q [B, S, H, Dh]
  evenly: batch over the `data` / `fsdp` axes, heads over `tensor`; None without a mesh or when
  nothing splits."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  batch = tuple(a for a in ("data", "fsdp") if sizes.get(a, 1) > 1)
  if batch and q.shape[0] % int(np.prod([sizes[a] for a in batch])):
    batch = ()
  tensor = sizes.get("tensor", 1)
  heads_4d = mask.dense.ndim == 4 and mask.dense.shape[1] > 1
  head = (
    "tensor"
    if tensor > 1
    and q.shape[2] % tensor == 0
    and k.shape[2] == q.shape[2]
    and (not heads_4d or mask.dense.shape[1] % tensor == 0)
    else None
  )
  return None if not batch and head is None else (batch, head)


def per_shard(fn, q, k, v, mask: "TiledMask"):
  """fn(q, k, v, mask) run under `jax.shard_map` over the context mesh's batch and head axes
  (each device runs the tiled / splash kernel on its rows and heads: no gather, no kernel that
  has to know the mesh); plain fn outside a mesh."""
  split = _mesh_split(q, k, mask)
  if split is None:
    return fn(q, k, v, mask)
  batch, head = split
  from jax.sharding import PartitionSpec as P

  b = batch or None
  qkv = P(b, None, head, None)
  dense = mask.dense
  m = (
    P(b, head if dense.shape[1] > 1 else None, None, None) if dense.ndim == 4 else P(b, None, None)
  )
  static = mask.static
  local = lambda q, k, v, d: fn(q, k, v, TiledMask(d, static))
  return jax.shard_map(local, in_specs=(qkv, qkv, qkv, m), out_specs=qkv, check_vma=False)(
    q, k, v, dense
  )


def attend(q, k, v, mask, implementation: str = "dense"):
  if isinstance(mask, TiledMask):
    if implementation == "blocksparse":
      return per_shard(blocksparse_attention, q, k, v, mask)
    if implementation == "splash":
      return per_shard(splash_attention, q, k, v, mask)
    mask = mask.dense
  if implementation in ("dense", "blocksparse", "splash"):
    return dense_attention(q, k, v, mask)
  if implementation in ("xla", "cudnn"):
    # A fully masked query row gets the dense path's uniform average over all keys: it attends
    # to every key with a zero query (all scores 0), so no row is left without a key.
    mask = _as_4d(mask)
    empty = ~jnp.any(mask, axis=-1, keepdims=True)  # [B, 1|H, Sq, 1]
    q = jnp.where(jnp.swapaxes(empty, 1, 2), jnp.zeros_like(q), q)  # [B, Sq, 1|H, 1]
    return jax.nn.dot_product_attention(q, k, v, mask=mask | empty, implementation=implementation)
  raise ValueError(
    f"unknown attention implementation {implementation!r}; use one of {IMPLEMENTATIONS}"
  )
