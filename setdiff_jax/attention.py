"""Attention implementations behind one signature.

`attend(q, k, v, mask, implementation)`:
  q: [B, Sq, H, Dh], k, v: [B, Sk, H, Dh], mask: bool [B, Sq, Sk] or [B, 1, Sq, Sk] (True = attend).
  Returns [B, Sq, H, Dh] in q's dtype.

- `dense`: explicit einsum with fp32 softmax; masked scores are set to float32 min (finite, so a
  fully masked row gives a uniform softmax instead of NaN, as the reference's SDPA additive mask).
  The reference for tests and CPU.
- `xla` / `cudnn`: `jax.nn.dot_product_attention` (fused kernels on GPU with `cudnn`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("dense", "xla", "cudnn")


def _as_4d(mask: jax.Array) -> jax.Array:
  return mask[:, None] if mask.ndim == 3 else mask


def dense_attention(q, k, v, mask):
  scale = q.shape[-1] ** -0.5
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(_as_4d(mask), scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def attend(q, k, v, mask, implementation: str = "dense"):
  if implementation == "dense":
    return dense_attention(q, k, v, mask)
  if implementation in ("xla", "cudnn"):
    # A fully masked row attends to every key: the uniform softmax the dense path gives.
    mask = _as_4d(mask)
    mask = mask | ~jnp.any(mask, axis=-1, keepdims=True)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
  raise ValueError(f"unknown attention implementation {implementation!r}; use one of {IMPLEMENTATIONS}")
