"""Pieces every backbone shares: rotary embeddings and the mask-token logit suppression.

  rotary_cos_sin(positions [B, S], head_dim, base) -> cos, sin fp32 [B, S, Dh]
  apply_rotary(x [B, S, H, Dh], cos, sin)          -> x rotated (half-split RoPE, SPEC §3.3)
  NEG_INF_LOGIT                                    the mask token's logit (SPEC §3.5)
  suppress_mask_logit(logits [..., V], id)         logits with column `id` set to NEG_INF_LOGIT

Each backbone keeps its own norms and initialisers (the DiT's LayerNorm without bias and PyTorch
inits, Qwen3's RMSNorm and normal(0.02)): no two backbones share one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF_LOGIT = -1e12  # the reference's mask-token logit (SPEC §3.5)


def suppress_mask_logit(logits: jax.Array, mask_token_id: int) -> jax.Array:
  """Sets the mask token's logit to -1e12 (SPEC §3.5, §8.8): the model never puts mass on M."""
  return logits.at[..., mask_token_id].set(NEG_INF_LOGIT)


def rotary_cos_sin(positions: jax.Array, head_dim: int, base: float = 10000.0):
  """cos, sin of the half-split rotary table, fp32 [B, S, Dh] (SPEC §3.3), computed once.

  XLA fuses a unary chain like cos(positions * f) into every consumer, so without care each
  layer's rotary products of q and k, forward and backward, re-evaluate both transcendentals for
  every element of [B, S, H, Dh] (16 such fusions in a 4-layer DiT step: ~10 % of its time on the
  2-core CPU). `_as_buffer` makes the table one array that those fusions read.
  """
  inv_freq = 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  theta = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, S, Dh/2]
  theta = jnp.concatenate([theta, theta], axis=-1)
  cos_sin = _as_buffer(jnp.stack([jnp.cos(theta), jnp.sin(theta)]))
  return cos_sin[0], cos_sin[1]


def _as_buffer(x: jax.Array) -> jax.Array:
  """x, materialised: XLA does not fuse a reduction into its consumers, so x + 0 summed over a
  size-2 axis is computed once, where an elementwise chain would be recomputed in each consumer.
  Exact (x + 0 = x; only a -0.0 becomes +0.0). `jax.lax.optimization_barrier` does not do this on
  CPU: XLA:CPU expands it before fusion."""
  return jnp.sum(jnp.stack([x, jnp.zeros_like(x)]), axis=0)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x: [B, S, H, Dh]; z' = z cos + rotate_half(z) sin, in x's dtype."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


__all__ = ["NEG_INF_LOGIT", "suppress_mask_logit", "rotary_cos_sin", "apply_rotary"]
