"""The Qwen3 backbone in Flax Linen (SPEC §3.10), with the DiT's call signature.

Architecture (Hugging Face `Qwen3ForCausalLM`): token embedding; per layer pre-RMSNorm attention
with per-head RMSNorm on q and k, RoPE (config theta) on *arbitrary* position ids, grouped-query
attention (K KV heads shared by H query heads), then pre-RMSNorm SwiGLU MLP; final RMSNorm and an
LM head tied to the embedding or untied. No biases.

Parameter tree (maps one-to-one to the HF state dict; see `interop/qwen3_map.py`):

  embed/embedding                       (V, D)
  layers_{i}/input_norm/scale           (D,)
  layers_{i}/q_proj/kernel              (D, H Dh)
  layers_{i}/k_proj/kernel              (D, K Dh)
  layers_{i}/v_proj/kernel              (D, K Dh)
  layers_{i}/q_norm/scale, k_norm/scale (Dh,)
  layers_{i}/o_proj/kernel              (H Dh, D)
  layers_{i}/post_attn_norm/scale       (D,)
  layers_{i}/gate_proj/kernel           (D, F)
  layers_{i}/up_proj/kernel             (D, F)
  layers_{i}/down_proj/kernel           (F, D)
  final_norm/scale                      (D,)
  lm_head/kernel                        (D, V)     untied models only
  (scan_layers=True: one `layers/...` subtree, every leaf [num_layers, ...]; layer_names.py)

The KV cache holds keys (after k-norm and RoPE) and values of the K KV heads only:
per layer (k, v), each [B, C, K, Dh]; the query-head repeat happens inside attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from setdiff_jax.config.fields import integer, number
from setdiff_jax.models import attention
from setdiff_jax.models import layer_stack
from setdiff_jax.models.layers import apply_rotary, rotary_cos_sin

KVCache = Tuple[Tuple[jax.Array, jax.Array], ...]  # per layer (k [B, C, K, Dh], v [B, C, K, Dh])


# Field ranges checked when a Qwen3Config is built (as the run config's Model section's; its
# 0 = "derive it" is resolved by `from_config` before).
RANGES = {
  **layer_stack.COMMON_RANGES,
  "num_kv_heads": integer(1),
  "head_dim": integer(1),
  "intermediate_size": integer(1),
  "rms_norm_eps": number(0, lo_open=True),
}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
  """Qwen3 hyperparameters. Defaults: the tiny CPU model; Qwen3-1.7B is 28 x 2048, 16 / 8 heads,
  head_dim 128, MLP 6144, V = 151936, theta 1e6, tied head."""

  vocab_size: int = 151936
  hidden_size: int = 256
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 64
  intermediate_size: int = 768
  rope_base: float = 1_000_000.0  # RoPE theta (HF `rope_theta`)
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  dropout: float = 0.0  # residual-branch dropout (the reference Qwen3 has none)
  dtype: str = "float32"  # compute dtype; params stay fp32
  attention: str = "dense"  # see attention.IMPLEMENTATIONS
  remat: Any = "none"  # remat policy per layer (layer_stack.REMAT_POLICIES; bools ok)
  scan_layers: bool = False  # nn.scan over the layers: params `layers/...` [num_layers, ...]
  fused_head: bool = True  # training losses: fused LM head + cross-entropy (fused_head.py)
  head_chunk_rows: int = 0  # fused head: rows per chunk (0 = all rows at once)
  head_recompute: bool = False  # fused head: recompute logits in the backward
  head_vocab_chunk: int = 1024  # fused head: vocabulary columns per chunk (0 = off; fused_head.py)

  def __post_init__(self):
    layer_stack.check_ranges(self, RANGES)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads={self.num_heads} is not a multiple of "
        f"num_kv_heads={self.num_kv_heads} (grouped-query attention)"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
    layer_stack.check_common_fields(self)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def kv_heads(self) -> int:
    """Heads stored in the KV cache."""
    return self.num_kv_heads

  @classmethod
  def from_config(cls, cfg) -> "Qwen3Config":
    """Builds from a mapping (e.g. `config.model`), ignoring unknown fields; 0 = the default
    derivation (num_kv_heads = num_heads, head_dim = D / H, intermediate_size = 3D)."""
    d = dict(cfg)
    names = {f.name for f in dataclasses.fields(cls)}
    out = {k: v for k, v in d.items() if k in names}
    if not out.get("num_kv_heads"):
      out["num_kv_heads"] = out.get("num_heads", cls.num_heads)
    if not out.get("head_dim"):
      out["head_dim"] = out.get("hidden_size", cls.hidden_size) // out.get(
        "num_heads", cls.num_heads
      )
    if not out.get("intermediate_size"):
      out["intermediate_size"] = 3 * out.get("hidden_size", cls.hidden_size)
    return cls(**out)


def _normal(std=0.02):
  return nn.initializers.normal(std)  # HF `initializer_range` = 0.02


class RMSNorm(nn.Module):
  """HF Qwen3RMSNorm: normalise in fp32, cast back, then scale in the input dtype."""

  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
    return scale.astype(x.dtype) * y.astype(x.dtype)


class Dense(nn.Module):
  """Bias-free linear with an fp32 `kernel` (in, out), computed in `dtype`."""

  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", _normal(), (x.shape[-1], self.features), jnp.float32)
    return jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))


class Qwen3Layer(nn.Module):
  config: Qwen3Config
  kv_layout: str = "bshd"  # of past_kv and the returned kv (attention.KV_LAYOUTS)

  @nn.compact
  def __call__(self, h, cos, sin, mask, past_kv, deterministic: bool):
    cfg = self.config
    dt = cfg.compute_dtype
    b, s, _ = h.shape
    nh, nk, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    a = RMSNorm(cfg.rms_norm_eps, name="input_norm")(h).astype(dt)
    q = Dense(nh * dh, dt, name="q_proj")(a).reshape(b, s, nh, dh)
    k = Dense(nk * dh, dt, name="k_proj")(a).reshape(b, s, nk, dh)
    v = Dense(nk * dh, dt, name="v_proj")(a).reshape(b, s, nk, dh)
    q = RMSNorm(cfg.rms_norm_eps, name="q_norm")(q)
    k = RMSNorm(cfg.rms_norm_eps, name="k_norm")(k)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    # KV heads only
    new_kv = (attention.to_kv_layout(k, self.kv_layout), attention.to_kv_layout(v, self.kv_layout))
    if past_kv is not None:
      o = attention.attend_cached(
        q, k, v, past_kv[0], past_kv[1], mask, cfg.attention, self.kv_layout
      )
    else:
      if nh != nk:  # query head j reads KV head j // (H / K), as HF `repeat_kv`
        k, v = jnp.repeat(k, nh // nk, axis=2), jnp.repeat(v, nh // nk, axis=2)
      o = attention.attend(q, k, v, mask, cfg.attention)
    o = o.reshape(b, s, nh * dh)
    o = layer_stack.tag_attention_out(o)
    o = Dense(cfg.hidden_size, dt, name="o_proj")(o)
    h = h + nn.Dropout(cfg.dropout)(o, deterministic=deterministic).astype(h.dtype)

    a = RMSNorm(cfg.rms_norm_eps, name="post_attn_norm")(h).astype(dt)
    g = Dense(cfg.intermediate_size, dt, name="gate_proj")(a)
    u = Dense(cfg.intermediate_size, dt, name="up_proj")(a)
    m = Dense(cfg.hidden_size, dt, name="down_proj")(nn.silu(g) * u)
    h = h + nn.Dropout(cfg.dropout)(m, deterministic=deterministic).astype(h.dtype)
    return h, new_kv


class Qwen3(nn.Module):
  """ids + position ids + bool mask (+ KV cache) -> logits; the `DiT` call signature.

  Call:
    tokens, positions: int [B, S]; mask: bool [B, S, C + S] or [B, 1, S, C + S] (True = attend);
    kv_cache: optional per-layer (k, v), each [B, C, K, Dh] (keys after k-norm and RoPE), or
      [B, K, C, Dh] with kv_layout="bhsd" (the samplers' head-major cache);
    sigma: accepted for signature compatibility and ignored (no time conditioning);
    head_start: static int; the final norm and LM head run on rows [head_start:] only;
    return_kv: also return this call's per-layer (k, v) [B, S, K, Dh] (in `kv_layout`);
    return_hidden: return the final-normed hidden states [B, S - head_start, D] that enter the
      LM head instead of the logits (`output_head` gives the head; fused_head.py applies it).
  Returns:
    logits fp32 [B, S - head_start, V] (raw; the caller suppresses the mask token, as for the
    DiT), and the new kv if asked.
  """

  config: Qwen3Config

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
    del sigma
    cfg = self.config
    attention.check_kv_layout(kv_layout)
    embed = nn.Embed(
      cfg.vocab_size,
      cfg.hidden_size,
      embedding_init=_normal(),
      param_dtype=jnp.float32,
      dtype=jnp.float32,
      name="embed",
    )
    # The residual stream stays fp32 (as the DiT's); each matmul runs in the compute dtype.
    h = embed(tokens)
    cos, sin = rotary_cos_sin(positions, cfg.head_dim, cfg.rope_base)

    h, new_kvs = layer_stack.apply_layers(
      Qwen3Layer, cfg, "layers", h, (cos, sin, mask), kv_cache, deterministic, kv_layout=kv_layout
    )

    h = RMSNorm(cfg.rms_norm_eps, name="final_norm")(h[:, head_start:])
    if return_hidden and not self.is_initializing():
      return (h, new_kvs) if return_kv else h
    dt = cfg.compute_dtype
    if cfg.tie_embeddings:
      logits = jnp.dot(h.astype(dt), embed.embedding.T.astype(dt))
    else:
      logits = Dense(cfg.vocab_size, dt, name="lm_head")(h)
    logits = logits.astype(jnp.float32)
    if return_kv:
      return logits, new_kvs
    return logits

  def decode_step(self, tokens, positions, mask, kv_cache=None, head_start: int = 0, hidden=False):
    """The samplers' and scorers' call: (logits fp32 [B, S - head_start, V], or with `hidden` the
    states that enter the head [B, S - head_start, D]; this call's per-layer (k, v) head-major,
    [B, K, S, Dh]), kv_cache head-major too, deterministic. `models.decode_step` applies it."""
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

  def output_head(self, params):
    """(kernel [D, V], None) of the LM head: the embedding transposed when tied (no bias)."""
    if self.config.tie_embeddings:
      return jnp.transpose(params["embed"]["embedding"]), None
    return params["lm_head"]["kernel"], None

  def head_vd(self, params):
    """The LM head as [V, D] when the params hold it so (the tied embedding), else None."""
    return params["embed"]["embedding"] if self.config.tie_embeddings else None


__all__ = ["Qwen3Config", "Qwen3", "Qwen3Layer", "RMSNorm", "KVCache"]
