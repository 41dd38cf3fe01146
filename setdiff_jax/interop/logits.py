"""Our raw logits for any backbone, for parity checks (jax; fp32, dense attention, dropout off).

  jax_logits(config, params, tokens, positions, allowed) -> np.ndarray fp32 [B, S, V]

`config`: a run config (its `model` block is used) or a `config.model` mapping; the vocabulary
is read off `params`. `allowed`: bool [B, S, S] (True = attend). No mask-token suppression.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import models
from setdiff_jax import layer_names
from setdiff_jax.interop.name_map import flatten


def fp32_backbone_config(config, params):
  model_cfg = config.get("model", config) if hasattr(config, "get") else config
  model_cfg = dict(model_cfg)
  vocab = int(np.shape(flatten(params)[("embed", "embedding")])[0])
  cfg = models.backbone_config(model_cfg, vocab)
  return models.replace(cfg, dtype="float32", attention="dense")


@functools.lru_cache(maxsize=32)
def _forward(backbone_cfg, return_kv: bool):
  module = models.build(backbone_cfg)
  return jax.jit(
    lambda p, t, q, m, c: module.apply(
      {"params": p}, t, q, m, kv_cache=c, return_kv=return_kv, deterministic=True
    )
  )


def jax_forward(
  backbone_cfg, params, tokens, positions, allowed, kv_cache=None, return_kv: bool = False
):
  """The backbone's raw outputs (jitted once per config); kv_cache as the model takes it; params
  per-layer or scanned (converted to the config's `scan_layers` layout)."""
  params = layer_names.to_layout(params, getattr(backbone_cfg, "scan_layers", False))
  return _forward(backbone_cfg, return_kv)(
    params,
    jnp.asarray(tokens, jnp.int32),
    jnp.asarray(positions, jnp.int32),
    jnp.asarray(allowed, bool),
    kv_cache,
  )


def jax_logits(config, params, tokens, positions, allowed) -> np.ndarray:
  allowed = np.asarray(allowed, bool)
  if allowed.ndim != 3:
    raise ValueError(f"allowed must be bool [B, S, S], got shape {allowed.shape}")
  cfg = fp32_backbone_config(config, params)
  out = jax_forward(cfg, params, tokens, positions, allowed)
  return np.asarray(out, np.float32)


__all__ = ["jax_logits", "jax_forward", "fp32_backbone_config"]
