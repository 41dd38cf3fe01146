"""Backbone registry: `config.model.backbone` = dit | qwen3, one call signature for all.

  backbone_config(model_cfg, vocab_size) -> BackboneConfig (DiTConfig | Qwen3Config; frozen)
  build(backbone_cfg) -> Backbone           (DiT | Qwen3, a flax Module; same __call__ signature)
  init_params(backbone_cfg, rng, seq_len) / param_shapes(backbone_cfg)
  cache_layout(backbone_cfg) -> (num_layers, kv_heads, head_dim)   what a KV cache stores
  is_backbone(module) -> bool

Every backbone is called as
  module.apply({"params": p}, tokens [B,S], positions [B,S], mask bool [B,S,C+S],
               kv_cache=None | per-layer (k, v) [B,C,kv_heads,Dh], deterministic=True,
               head_start=0, return_kv=False) -> logits fp32 [B, S-head_start, V] (, kv)
with raw logits (mask-token suppression is the caller's, `layers.suppress_mask_logit`).
Decoding calls `decode_step(module, params, ...)`: the module's `decode_step` method (head-major
kv returned beside the logits, or the hidden states that enter the head).
The DiT stays in `setdiff_jax/models/dit.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Union

import jax
import jax.numpy as jnp

from setdiff_jax.models import attention
from setdiff_jax.models import dit as dit_lib
from setdiff_jax.models import qwen3 as qwen3_lib

Backbone = Union[dit_lib.DiT, qwen3_lib.Qwen3]  # any backbone module (type hints)
BackboneConfig = Union[dit_lib.DiTConfig, qwen3_lib.Qwen3Config]  # any backbone config

BACKBONES = {
  "dit": (dit_lib.DiTConfig, dit_lib.DiT),
  "qwen3": (qwen3_lib.Qwen3Config, qwen3_lib.Qwen3),
}


def backbone_name(model_cfg: Mapping) -> str:
  name = str(dict(model_cfg).get("backbone", "dit") or "dit")
  if name not in BACKBONES:
    raise ValueError(f"model.backbone={name!r}; expected one of {sorted(BACKBONES)}")
  return name


def backbone_config(model_cfg: Mapping, vocab_size: int | None = None) -> BackboneConfig:
  """The frozen backbone config from `config.model` (+ the vocabulary size, if given)."""
  fields = dict(model_cfg)
  if vocab_size is not None:
    fields["vocab_size"] = int(vocab_size)
  cfg_cls, _ = BACKBONES[backbone_name(fields)]
  return cfg_cls.from_config(fields)


def name_of(backbone_cfg) -> str:
  for name, (cfg_cls, _) in BACKBONES.items():
    if isinstance(backbone_cfg, cfg_cls):
      return name
  raise TypeError(f"not a backbone config: {type(backbone_cfg).__name__}")


def build(backbone_cfg: BackboneConfig) -> Backbone:
  """The Flax module of a backbone config (its vocab_size resolved: >= 1)."""
  if int(backbone_cfg.vocab_size) < 1:
    raise ValueError(
      f"vocab_size={backbone_cfg.vocab_size}: a model needs its vocabulary size (0 in a run "
      "config means the tokenizer's; resolve it, e.g. dataclasses.replace(cfg, vocab_size=V))"
    )
  return BACKBONES[name_of(backbone_cfg)][1](backbone_cfg)


def is_backbone(module) -> bool:
  return any(isinstance(module, mod_cls) for _, mod_cls in BACKBONES.values())


def decode_step(module, params, tokens, positions, mask, kv_cache, head_start=0, hidden=False):
  """`module.decode_step` on `params`: (logits fp32 [B, S - head_start, V] or, with `hidden`, the
  hidden states [B, S - head_start, D] that enter `output_head`; this call's head-major kv)."""
  return module.apply(
    {"params": params},
    tokens,
    positions,
    mask,
    kv_cache,
    head_start,
    hidden,
    method=type(module).decode_step,
  )


def replace(backbone_cfg, **changes):
  """`dataclasses.replace`, keeping only the fields this backbone has."""
  names = {f.name for f in dataclasses.fields(backbone_cfg)}
  return dataclasses.replace(backbone_cfg, **{k: v for k, v in changes.items() if k in names})


def init_params(backbone_cfg, rng: jax.Array, seq_len: int = 8):
  """Initialises parameters for a batch-1 input of `seq_len` tokens."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  positions = jnp.arange(seq_len, dtype=jnp.int32)[None]
  mask = jnp.ones((1, seq_len, seq_len), bool)
  return build(backbone_cfg).init(rng, tokens, positions, mask)["params"]


def param_shapes(backbone_cfg, seq_len: int = 8):
  """Parameter shapes via `jax.eval_shape` (no memory is allocated)."""
  return jax.eval_shape(lambda r: init_params(backbone_cfg, r, seq_len), jax.random.key(0))


def cache_layout(backbone_cfg) -> tuple:
  """(num_layers, heads stored per layer, head dim) of this backbone's KV cache."""
  if isinstance(backbone_cfg, qwen3_lib.Qwen3Config):
    return backbone_cfg.num_layers, backbone_cfg.num_kv_heads, backbone_cfg.head_dim
  return backbone_cfg.num_layers, backbone_cfg.num_heads, backbone_cfg.head_dim


def empty_kv(backbone_cfg, batch: int, capacity: int, dtype: Any = None, kv_layout: str = "bshd"):
  """Zero per-layer (k, v) [B, C, kv_heads, Dh] ("bhsd": [B, kv_heads, C, Dh]), from the config."""
  attention.check_kv_layout(kv_layout)
  layers, heads, dim = cache_layout(backbone_cfg)
  dtype = dtype or backbone_cfg.compute_dtype
  shape = (batch, capacity, heads, dim) if kv_layout == "bshd" else (batch, heads, capacity, dim)
  z = lambda: jnp.zeros(shape, dtype)
  return tuple((z(), z()) for _ in range(layers))


__all__ = [
  "Backbone",
  "BackboneConfig",
  "BACKBONES",
  "backbone_name",
  "backbone_config",
  "name_of",
  "build",
  "is_backbone",
  "decode_step",
  "replace",
  "init_params",
  "param_shapes",
  "cache_layout",
  "empty_kv",
]
