"""The DiT backbone of Set Diffusion in Flax Linen (SPEC §3).

Parameter tree (maps one-to-one to the official `DIT` state dict, SPEC §3.9; see `interop/`):

  embed/embedding                      (V, D)
  blocks_{i}/norm1/scale               (D,)        LayerNorm, no bias, fp32
  blocks_{i}/attn_qkv/kernel           (D, 3D)     output split (3, H, Dh)
  blocks_{i}/attn_out/kernel           (D, D)
  blocks_{i}/norm2/scale               (D,)
  blocks_{i}/mlp_in/{kernel,bias}      (D, 4D)
  blocks_{i}/mlp_out/{kernel,bias}     (4D, D)
  blocks_{i}/adaln/{kernel,bias}       (C, 6D)     adaLN models only
  (scan_layers=True: one `blocks/...` subtree, every leaf [num_layers, ...]; layer_names.py)
  final_norm/scale                     (D,)
  final_adaln/{kernel,bias}            (C, 2D)     adaLN models only
  head/{kernel,bias}                   (D, V)      untied, zero-initialised
  sigma_map/dense0, sigma_map/dense1   (256, C), (C, C)   adaLN models only

Inputs are token ids and *arbitrary* position ids (RoPE follows the original position of each
token, whatever its slot), plus a boolean attention mask; an optional KV cache (keys after RoPE,
values) is prepended to the keys.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from setdiff_jax.config.fields import integer, number
from setdiff_jax.models import attention
from setdiff_jax.models import layer_stack
from setdiff_jax.models.layers import apply_rotary, rotary_cos_sin

KVCache = Tuple[Tuple[jax.Array, jax.Array], ...]  # per layer (k [B, C, H, Dh], v [B, C, H, Dh])


# Field ranges checked when a DiTConfig is built (as the run config's Model section's).
RANGES = {
  **layer_stack.COMMON_RANGES,
  "mlp_ratio": number(0, lo_open=True),
  "cond_dim": integer(1),
}


@dataclasses.dataclass(frozen=True)
class DiTConfig:
  """Backbone hyperparameters (SPEC §3.1). LM1B: 12 x 768, 12 heads, V = 30522."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_ratio: int = 4
  cond_dim: int = 128
  adaln: bool = False  # MDLM/BD3LM baselines: adaLN with constant sigma = 0 (SPEC §3.4)
  dropout: float = 0.1  # on the two residual branches only
  dtype: str = "float32"  # compute dtype ("bfloat16" for mixed precision); params stay fp32
  attention: str = "dense"  # see attention.IMPLEMENTATIONS
  rope_base: float = 10000.0
  remat: Any = "none"  # remat policy of each block (layer_stack.REMAT_POLICIES; bools ok)
  scan_layers: bool = False  # nn.scan over the blocks: params `blocks/...` [num_layers, ...]
  fused_head: bool = True  # training losses: fused head + cross-entropy (fused_head.py)
  head_chunk_rows: int = 0  # fused head: rows per chunk (0 = all rows at once)
  head_recompute: bool = False  # fused head: recompute logits in the backward (no [N, V] residual)
  head_vocab_chunk: int = 1024  # fused head: vocabulary columns per chunk (0 = off; fused_head.py)

  def __post_init__(self):
    layer_stack.check_ranges(self, RANGES)
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
      )
    if (self.hidden_size // self.num_heads) % 2:
      raise ValueError(
        f"num_heads={self.num_heads} gives head dim hidden_size / num_heads = "
        f"{self.hidden_size} / {self.num_heads} = {self.hidden_size // self.num_heads}, which "
        "must be even for rotary embeddings: choose num_heads so that it is"
      )
    layer_stack.check_common_fields(self)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @classmethod
  def from_config(cls, cfg) -> "DiTConfig":
    """Builds from a mapping (e.g. an ml_collections `config.model`), ignoring unknown fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cfg).items() if k in names})


# ----------------------------------------------------------------------------- initialisers
def torch_linear_kernel_init():
  """PyTorch nn.Linear default: Kaiming-uniform(a=sqrt 5) = U(+-1/sqrt(fan_in))."""
  return nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_linear_bias_init(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def torch_embedding_init(hidden_size: int):
  """Kaiming-uniform(a=sqrt 5) on a (V, D) tensor: U(+-1/sqrt(D)) (SPEC §3.6)."""
  bound = 1.0 / math.sqrt(hidden_size)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _dense(module: nn.Module, x, kernel_init, bias_init):
  """Parameters `kernel` (and `bias`) created directly on `module` (flat names as SPEC §3.9)."""
  kernel = module.param("kernel", kernel_init, (x.shape[-1], module.features), jnp.float32)
  # A 2-D [rows, D] matmul: XLA:CPU runs [B, S, D] x [D, F] (and its kernel gradient, a
  # contraction over two axes) noticeably slower than the same math on flattened rows.
  rows = x.reshape(-1, x.shape[-1]).astype(module.dtype)
  y = jnp.dot(rows, kernel.astype(module.dtype))
  if module.use_bias:
    bias = module.param("bias", bias_init, (module.features,), jnp.float32)
    y = y + bias.astype(module.dtype)
  return y.reshape(x.shape[:-1] + (module.features,))


# ----------------------------------------------------------------------------- pieces
class LayerNormNoBias(nn.Module):
  """LayerNorm with a weight and no bias, computed in fp32 and cast back (SPEC §3.2)."""

  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.epsilon) * scale
    return y.astype(x.dtype)


def timestep_embedding(t: jax.Array, dim: int = 256, max_period: float = 10000.0) -> jax.Array:
  """Sinusoidal [cos, sin] embedding of the (always zero) time, fp32 [B, dim] (SPEC §3.4)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = t.astype(jnp.float32)[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


class Linear(nn.Module):
  """nn.Linear with PyTorch initialisation; params `kernel` (in, out) and optional `bias`."""

  features: int
  use_bias: bool = True
  zero_init: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    kernel_init = nn.initializers.zeros if self.zero_init else torch_linear_kernel_init()
    bias_init = nn.initializers.zeros if self.zero_init else torch_linear_bias_init(x.shape[-1])
    return _dense(self, x, kernel_init, bias_init)


class SigmaMap(nn.Module):
  """TimestepEmbedder: sinusoid(256) -> Linear -> SiLU -> Linear (adaLN models)."""

  cond_dim: int

  @nn.compact
  def __call__(self, sigma):
    h = timestep_embedding(sigma)
    h = Linear(self.cond_dim, name="dense0")(h)
    return Linear(self.cond_dim, name="dense1")(nn.silu(h))


class DiTBlock(nn.Module):
  config: DiTConfig
  kv_layout: str = "bshd"  # of past_kv and the returned kv (attention.KV_LAYOUTS)

  @nn.compact
  def __call__(self, h, cos, sin, mask, cond, past_kv, deterministic: bool):
    cfg = self.config
    dt = cfg.compute_dtype
    b, s, _ = h.shape
    if cfg.adaln:
      mod = Linear(6 * cfg.hidden_size, zero_init=True, name="adaln")(cond)[:, None, :]
      shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = jnp.split(mod, 6, axis=-1)

    a = LayerNormNoBias(name="norm1")(h)
    if cfg.adaln:
      a = a * (1 + scale_msa) + shift_msa
    qkv = Linear(3 * cfg.hidden_size, use_bias=False, dtype=dt, name="attn_qkv")(a)
    qkv = qkv.reshape(b, s, 3, cfg.num_heads, cfg.head_dim)  # (3, H, Dh) output layout
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    new_kv = (attention.to_kv_layout(k, self.kv_layout), attention.to_kv_layout(v, self.kv_layout))
    if past_kv is None:
      o = attention.attend(q, k, v, mask, cfg.attention)
    else:
      o = attention.attend_cached(
        q, k, v, past_kv[0], past_kv[1], mask, cfg.attention, self.kv_layout
      )
    o = o.reshape(b, s, cfg.hidden_size)
    o = layer_stack.tag_attention_out(o)
    o = Linear(cfg.hidden_size, use_bias=False, dtype=dt, name="attn_out")(o)
    if cfg.adaln:
      o = gate_msa * o
    h = h + nn.Dropout(cfg.dropout)(o, deterministic=deterministic)

    a = LayerNormNoBias(name="norm2")(h)
    if cfg.adaln:
      a = a * (1 + scale_mlp) + shift_mlp
    m = Linear(cfg.mlp_ratio * cfg.hidden_size, dtype=dt, name="mlp_in")(a)
    m = nn.gelu(m, approximate=True)
    m = Linear(cfg.hidden_size, dtype=dt, name="mlp_out")(m)
    if cfg.adaln:
      m = gate_mlp * m
    h = h + nn.Dropout(cfg.dropout)(m, deterministic=deterministic)
    return h, new_kv


class DiT(nn.Module):
  """The backbone: ids + position ids + bool mask (+ KV cache) -> logits (SPEC §3.2).

  Call:
    tokens: int [B, S]; positions: int [B, S] (absolute position of each token);
    mask: bool [B, S, C + S] or [B, 1, S, C + S] (True = attend; C = cache length, 0 without);
    kv_cache: optional per-layer (k, v), each [B, C, H, Dh] (keys after RoPE), or [B, H, C, Dh]
      with kv_layout="bhsd" (the samplers' head-major cache, read without a copy);
    sigma: optional float [B] time input for adaLN models (the reference always feeds 0);
    head_start: static int; the final norm and output head run on rows [head_start:] only, so a
      two-stream training forward pays the V-wide head for the noisy half only;
    return_kv: also return this call's per-layer (k, v) [B, S, H, Dh] (in `kv_layout`), for the
      caller's cache.
    return_hidden: return the hidden states that enter the head, [B, S - head_start, D], instead
      of the logits (the fused head + cross-entropy of `fused_head.py` applies `output_head`).
  Returns:
    logits fp32 [B, S - head_start, V] (raw; see `layers.suppress_mask_logit`), and the new kv
    if asked.
  """

  config: DiTConfig

  @nn.compact
  def __call__(
    self,
    tokens,
    positions,
    mask,
    *,
    kv_cache: Optional[KVCache] = None,
    sigma: Optional[jax.Array] = None,
    deterministic: bool = True,
    head_start: int = 0,
    return_kv: bool = False,
    return_hidden: bool = False,
    kv_layout: str = "bshd",
  ):
    cfg = self.config
    attention.check_kv_layout(kv_layout)
    h = nn.Embed(
      cfg.vocab_size,
      cfg.hidden_size,
      embedding_init=torch_embedding_init(cfg.hidden_size),
      param_dtype=jnp.float32,
      dtype=jnp.float32,
      name="embed",
    )(tokens)
    cos, sin = rotary_cos_sin(positions, cfg.head_dim, cfg.rope_base)
    cond = None
    if cfg.adaln:
      if sigma is None:
        sigma = jnp.zeros((tokens.shape[0],), jnp.float32)
      cond = nn.silu(SigmaMap(cfg.cond_dim, name="sigma_map")(sigma))

    h, new_kvs = layer_stack.apply_layers(
      DiTBlock,
      cfg,
      "blocks",
      h,
      (cos, sin, mask, cond),
      kv_cache,
      deterministic,
      kv_layout=kv_layout,
    )

    h = h[:, head_start:]
    h = LayerNormNoBias(name="final_norm")(h)
    if cfg.adaln:
      shift, scale = jnp.split(
        Linear(2 * cfg.hidden_size, zero_init=True, name="final_adaln")(cond)[:, None, :], 2, -1
      )
      h = h * (1 + scale) + shift
    if return_hidden and not self.is_initializing():
      return (h, new_kvs) if return_kv else h
    logits = Linear(cfg.vocab_size, zero_init=True, dtype=cfg.compute_dtype, name="head")(h)
    logits = logits.astype(jnp.float32)
    if return_kv:
      return logits, new_kvs
    return logits

  def decode_step(self, tokens, positions, mask, kv_cache=None, head_start: int = 0, hidden=False):
    """The samplers' and scorers' call: (logits fp32 [B, S - head_start, V], or with `hidden` the
    states that enter the head [B, S - head_start, D]; this call's per-layer (k, v) head-major,
    [B, H, S, Dh]), kv_cache head-major too, deterministic. `models.decode_step` applies it."""
    return self(
      tokens,
      positions,
      mask,
      kv_cache=kv_cache,
      head_start=head_start,
      return_kv=True,
      return_hidden=hidden,
      deterministic=True,
      kv_layout="bhsd",
    )

  @staticmethod
  def output_head(params):
    """(kernel [D, V], bias [V]) of the output head, for `fused_head.token_nll`."""
    return params["head"]["kernel"], params["head"]["bias"]


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


__all__ = [
  "DiTConfig",
  "DiT",
  "DiTBlock",
  "LayerNormNoBias",
  "timestep_embedding",
  "count_params",
  "KVCache",
]
