"""Running a backbone's layers: unrolled or `nn.scan`ned, under a remat policy (issue 13).

  apply_layers(block_cls, cfg, prefix, h, args, kv_cache, deterministic) -> (h, per-layer kv)

`cfg.scan_layers` False: layers `{prefix}_{i}` called one after the other (the historical tree,
SPEC §3.9 names). True: one `nn.scan` over a block whose parameters carry a leading layer axis,
`{prefix}/...` [num_layers, ...] (`layer_names.stack_layers` maps one tree onto the other); the
layer body is traced and compiled once, so compile time no longer grows with depth.

`cfg.remat` names what the backward pass keeps of each layer (`REMAT_POLICIES`):
  none                               keep every activation (no rematerialisation)
  full                               keep only the layer's inputs; recompute the whole layer
  dots_saveable                      keep every matmul output, recompute the elementwise work
  dots_with_no_batch_dims_saveable   keep matmuls without batch dimensions (the dense layers'
                                     2-D row matmuls), recompute attention's batched einsums
  save_attention_out                 keep only the attention output (`checkpoint_name`
                                     "attention_out", before the output projection)
Old configs' booleans map False -> none, True -> full (`normalize_remat`).

The KV cache stays one (k, v) pair per layer at the call boundary (what `sampling/cache.py`
stores and appends to); the scanned path stacks it to [num_layers, B, C, ...] for the scan and
returns this call's kv unstacked again.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from setdiff_jax.config.fields import integer, number
from setdiff_jax.models import attention, fused_head

ATTENTION_OUT = "attention_out"  # checkpoint_name of the attention output inside a block

REMAT_POLICIES = (
  "none",
  "full",
  "dots_saveable",
  "dots_with_no_batch_dims_saveable",
  "save_attention_out",
)
_BOOL_NAMES = {"false": "none", "true": "full", "0": "none", "1": "full", "": "none"}


def normalize_remat(value) -> str:
  """A remat policy name from a config value: a name, or a bool / "True" / "False" (old configs)."""
  if isinstance(value, bool) or value is None:
    return "full" if value else "none"
  name = _BOOL_NAMES.get(str(value).strip().lower(), str(value).strip())
  if name not in REMAT_POLICIES:
    raise ValueError(
      f"model.remat={value!r}; use one of {REMAT_POLICIES} (or True / False = full / none)"
    )
  return name


def remat_policy(name: str):
  """The `jax.checkpoint` policy of a normalised name (None = save nothing: full remat)."""
  cp = jax.checkpoint_policies
  return {
    "full": None,
    "dots_saveable": cp.dots_saveable,
    "dots_with_no_batch_dims_saveable": cp.dots_with_no_batch_dims_saveable,
    "save_attention_out": cp.save_only_these_names(ATTENTION_OUT),
  }[name]


def tag_attention_out(x: jax.Array) -> jax.Array:
  """Names a block's attention output for the `save_attention_out` policy (a no-op otherwise)."""
  return checkpoint_name(x, ATTENTION_OUT)


def _stack_kv(kv_cache: Sequence) -> Any:
  """Per-layer pytrees (k, v) [B, C, ...] -> one pytree of [num_layers, B, C, ...]."""
  return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *kv_cache)


def apply_layers(
  block_cls,
  cfg,
  prefix: str,
  h: jax.Array,
  args: Tuple,
  kv_cache: Optional[Sequence],
  deterministic: bool,
  **fields,
):
  """Runs `cfg.num_layers` blocks (inside a parent's compact method).

  block_cls(cfg, **fields)(h, *args, past_kv, deterministic) -> (h, kv) is one layer; `args` are
  the inputs every layer shares (rotary tables, mask, conditioning), broadcast to every scan step;
  `fields` are static block attributes (e.g. `kv_layout`).
  kv_cache: None or per-layer (k, v) [B, C, ...]. Returns (h, tuple of per-layer kv [B, S, ...]).
  """
  remat = normalize_remat(cfg.remat)
  scan = bool(getattr(cfg, "scan_layers", False))
  layer = block_cls
  if remat != "none":
    static = (len(args) + 3,)  # (self, h, *args, past_kv, deterministic): deterministic is static
    # prevent_cse is only needed outside a scan (flax / JAX docs: a scan already blocks CSE).
    layer = nn.remat(
      block_cls, static_argnums=static, policy=remat_policy(remat), prevent_cse=not scan
    )
  if not scan:
    kvs = []
    for i in range(cfg.num_layers):
      past = None if kv_cache is None else kv_cache[i]
      h, kv = layer(cfg, name=f"{prefix}_{i}", **fields)(h, *args, past, deterministic)
      kvs.append(kv)
    return h, tuple(kvs)
  stacked = None if kv_cache is None else _stack_kv(kv_cache)
  scanned = nn.scan(
    layer,
    variable_axes={"params": 0},
    split_rngs={"params": True, "dropout": True},
    in_axes=(nn.broadcast,) * len(args) + (0, nn.broadcast),
    length=cfg.num_layers,
  )
  h, kv = scanned(cfg, name=prefix, **fields)(h, *args, stacked, deterministic)
  return h, tuple(jax.tree_util.tree_map(lambda x, i=i: x[i], kv) for i in range(cfg.num_layers))


__all__ = [
  "REMAT_POLICIES",
  "ATTENTION_OUT",
  "normalize_remat",
  "remat_policy",
  "tag_attention_out",
  "apply_layers",
  "COMMON_RANGES",
  "check_ranges",
  "check_common_fields",
]


# The ranges of the fields every backbone config has, as the run config's Model section checks
# them (config/sections.py), so that a config built directly is refused the same way (dropout 1.5
# would drop every residual branch, num_layers -1 build no block, 0 heads divide by zero).
# vocab_size 0 is the run config's "the tokenizer's": a config may hold it until it is resolved
# (`models.build` refuses to build a model of it).
COMMON_RANGES = {
  "vocab_size": integer(0),
  "hidden_size": integer(1),
  "num_layers": integer(0),
  "num_heads": integer(1),
  "dropout": number(0, 1, hi_open=True),
  "rope_base": number(0, lo_open=True),
  "head_chunk_rows": integer(0),  # head_vocab_chunk: fused_head.check_head_fields
}


def check_ranges(cfg, ranges) -> None:
  """ValueError naming the first field of `cfg` outside its range in `ranges` ({field: Range})
  and the allowed values; call it before any rule that divides by a field."""
  for name, allowed in ranges.items():
    value = getattr(cfg, name)
    plain = value.item() if hasattr(value, "item") else value  # numpy / jax scalars: their value
    if not allowed.ok(plain):
      raise ValueError(
        f"{name}={value!r} is out of range for {type(cfg).__name__}; allowed: {allowed.describe()}"
      )


def check_common_fields(cfg) -> None:
  """The config rules every backbone shares (dtype, attention, remat, head, scan); normalises
  `cfg.remat` in place (a frozen dataclass). Raises ValueError naming the field."""
  if cfg.dtype not in ("float32", "bfloat16", "float16"):
    raise ValueError(f"model dtype {cfg.dtype!r} must be float32, bfloat16 or float16")
  if cfg.attention not in attention.IMPLEMENTATIONS:
    raise ValueError(f"attention={cfg.attention!r}; use one of {attention.IMPLEMENTATIONS}")
  object.__setattr__(cfg, "remat", normalize_remat(cfg.remat))
  fused_head.check_head_fields(cfg)
  if cfg.scan_layers and cfg.num_layers < 1:
    raise ValueError("scan_layers=True needs num_layers >= 1")
