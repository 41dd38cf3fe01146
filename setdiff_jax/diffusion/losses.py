"""Training objectives and likelihood bounds: SetDLM, AR, MDLM, BD3LM (SPEC §1.4, §1.6).

One loss function per method; `setdiff_jax.objectives` maps a method to its loss (nothing here
dispatches on the method's name). All share the backbone and return `(loss, metrics)`:
  loss     scalar: per-sequence mean, then batch mean (as the reference).
  metrics  {"loss", "nll_sum", "num_tokens", "num_sequences"}: summed over the batch, so a
           dataset-level NLL is sum(nll_sum) / sum(num_tokens), comparable across methods.

Batches are dicts of arrays [B, L]: `tokens` int, `attention_mask` (1 real, 0 pad), optional
`context_mask` (1 for prompt tokens that are never targets) and, for SetDLM, an optional `order`
int [B, L] that overrides the sampled order (tests, K-order evaluation).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from setdiff_jax.models import attention
from setdiff_jax.models import fused_head
from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion import orders
from setdiff_jax.models import Backbone

Metrics = Dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """What distinguishes the methods; the backbone is shared."""

  name: str = "setdlm"  # the method: a key of setdiff_jax.objectives.REGISTRY
  mask_token_id: int = 103
  pad_token_id: int = 0
  eos_token_id: int = 102
  keep_clean_bos: bool = True  # position 0 first in order, never masked, dropped in eval
  desired_set_size: int = 4  # SetDLM S
  max_set_size: Optional[int] = None  # SetDLM S_max (None = 2S)
  eos_last: bool = False  # setdlm_eos_last_in_target_order (training only)
  block_size: int = 4  # BD3LM block S
  antithetic: bool = False  # antithetic t (MDLM/BD3LM training)
  sampling_eps: float = 1e-3  # t = (1 - eps) u + eps
  ar_first_answer_token: bool = True  # AR with a prompt: train the first answer token (see ar_loss)
  eval_mask_counts: bool = False  # MDLM/BD3LM eval: k ~ U{1..n} masked per block (_mask_counts)

  @classmethod
  def from_config(cls, cfg) -> "ObjectiveConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cfg).items() if k in names})


def _batch_masks(batch) -> Tuple[jax.Array, jax.Array, jax.Array]:
  x = batch["tokens"].astype(jnp.int32)
  real = batch.get("attention_mask", jnp.ones_like(x)).astype(bool)
  context = batch.get("context_mask", jnp.zeros_like(x)).astype(bool)
  return x, real, real & ~context


def _reduce(nll: jax.Array, weight: jax.Array, denom: jax.Array) -> Tuple[jax.Array, Metrics]:
  """Per-sequence sum(w * nll) / denom (0 where denom == 0), then the batch mean."""
  nll_sum = jnp.sum(weight * nll, axis=-1)
  per_seq = jnp.where(denom > 0, nll_sum / jnp.maximum(denom, 1e-30), 0.0)
  loss = jnp.mean(per_seq)
  return loss, {
    "loss": loss,
    "nll_sum": jnp.sum(nll_sum),
    "num_tokens": jnp.sum(denom),
    "num_sequences": jnp.asarray(nll.shape[0], jnp.float32),
  }


def _apply(model: Backbone, params, tokens, positions, mask, *, train: bool, rng, **kwargs):
  rngs = {"dropout": rng} if train else {}
  return model.apply(
    {"params": params}, tokens, positions, mask, deterministic=not train, rngs=rngs, **kwargs
  )


# --------------------------------------------------------------------------------- SetDLM
def setdlm_inputs(cfg: ObjectiveConfig, batch, order: jax.Array):
  """Two-stream input of SPEC §1.4 steps 3-6 for a given order [B, L].

  Returns dict: tokens [B, 2L], positions [B, 2L], mask bool [B, 2L, 2L], targets [B, L] (clean
  tokens in order), target_weight [B, L] (real non-context tokens, in order).
  """
  x, real, target = _batch_masks(batch)
  length = x.shape[-1]
  noisy = jnp.where(target, cfg.mask_token_id, x)  # pads keep the pad id, context its token
  take = lambda a: jnp.take_along_axis(a, order, axis=-1)
  xs, ns = take(x), take(noisy)
  mask = jnp.asarray(masks.set_causal_mask(length))[None] & masks.two_stream_padding(take(real))
  return {
    "tokens": jnp.concatenate([xs, ns], -1),
    "positions": jnp.concatenate([order, order], -1),
    "mask": mask,
    "targets": xs,
    "target_weight": take(target),
  }


def setdlm_order(cfg: ObjectiveConfig, batch, rng, *, train: bool) -> jax.Array:
  """Samples the staggered order of SPEC §1.2 (or returns `batch['order']`)."""
  if "order" in batch:
    return batch["order"].astype(jnp.int32)
  x, _, target = _batch_masks(batch)
  permutable = target.at[:, 0].set(False) if cfg.keep_clean_bos else target
  order = orders.sample_order(
    rng,
    permutable,
    kind="staggered",
    desired_set_size=cfg.desired_set_size,
    max_set_size=cfg.max_set_size,
  )
  if train and cfg.eos_last:
    order = orders.move_eos_last(order, x, target, cfg.eos_token_id)
  return order


def setdlm_loss(cfg: ObjectiveConfig, model: Backbone, params, batch, rng, *, train: bool):
  """SetDLM loss (train) or one-order likelihood bound (eval), SPEC §1.4-1.5."""
  order_rng, dropout_rng = jax.random.split(rng)
  order = setdlm_order(cfg, batch, order_rng, train=train)
  inp = setdlm_inputs(cfg, batch, order)
  length = order.shape[-1]
  mask = attention.for_model(model, inp["mask"], masks.set_causal_mask(length))  # + tiles
  forward = functools.partial(
    _apply,
    model,
    params,
    inp["tokens"],
    inp["positions"],
    mask,
    train=train,
    rng=dropout_rng,
    head_start=length,
  )  # noisy half only
  nll = fused_head.token_nll(forward, model, params, inp["targets"], suppress_id=cfg.mask_token_id)
  weight = inp["target_weight"]
  if not train:
    if cfg.keep_clean_bos:
      weight = weight.at[:, 0].set(False)  # the first slot in order is the clean BOS
    weight = weight & (inp["targets"] != cfg.pad_token_id)
  weight = weight.astype(jnp.float32)
  return _reduce(nll, weight, jnp.sum(weight, -1))


# --------------------------------------------------------------------------------- AR
def ar_loss(cfg: ObjectiveConfig, model: Backbone, params, batch, rng, *, train: bool):
  """Shifted next-token NLL, causal attention, no M suppression (SPEC §1.6)."""
  x, real, target = _batch_masks(batch)
  inputs = x[:, :-1]
  n = inputs.shape[-1]
  positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), inputs.shape)
  mask = jnp.asarray(masks.causal_mask(n))[None]
  forward = functools.partial(_apply, model, params, inputs, positions, mask, train=train, rng=rng)
  nll = fused_head.token_nll(forward, model, params, x[:, 1:])
  # Label x_{j+1} counts when it is a target, and so does the first pad after the text (the
  # model learns to stop there). Without context this is the reference's input-side weight a_j;
  # with a prompt it also trains the first answer token, which the reference's a_j (1 - c_j)
  # drops (its AR could never emit that token); `ar_first_answer_token=False` reproduces it.
  if cfg.ar_first_answer_token:
    weight = target[:, 1:] | (target[:, :-1] & ~real[:, 1:])
  else:
    weight = target[:, :-1]
  weight = weight.astype(jnp.float32)
  return _reduce(nll, weight, jnp.sum(weight, -1))


# --------------------------------------------------------------------------------- MDLM / BD3LM
def _mask_at_times(cfg: ObjectiveConfig, x, target, t, rng):
  """x_t: each target token masked with probability t (the clean BOS kept under keep_clean_bos)."""
  xt = jnp.where((jax.random.uniform(rng, x.shape) < t) & target, cfg.mask_token_id, x)
  if cfg.keep_clean_bos:
    xt = xt.at[:, 0].set(x[:, 0])
  return xt


def _mask_counts(cfg: ObjectiveConfig, x, target, rng, block: int):
  """Eval with `cfg.eval_mask_counts`: (x_t, t [B, L]) where each block of `block` tokens with n
  targets has exactly k ~ U{1..n} of them masked (a uniform k-subset) and t = k / n. Under a
  time-independent backbone this is the discrete form of the same NELBO (∫ dt/t P(|M| = k | t) =
  1/k, so the 1/t weights n/k give E = Σ_k 1/k E_|M|=k[Σ_M -log p]; SPEC §1.6), with no draw that
  masks nothing: a one-token continuation is scored exactly. Without the t >= eps truncation."""
  b, length = x.shape
  if cfg.keep_clean_bos:
    target = target.at[:, 0].set(False)
  tgt = target.reshape(b, length // block, block)
  n = jnp.sum(tgt, -1, keepdims=True).astype(jnp.float32)  # [B, nb, 1]
  count_rng, subset_rng = jax.random.split(rng)
  u = jax.random.uniform(count_rng, n.shape)
  k = jnp.clip(jnp.floor(u * n) + 1.0, 1.0, jnp.maximum(n, 1.0))  # uniform on 1..n
  noise = jnp.where(tgt, jax.random.uniform(subset_rng, tgt.shape), 2.0)  # targets rank first
  rank = jnp.argsort(jnp.argsort(noise, -1), -1)
  masked = (rank < k) & tgt
  xt = jnp.where(masked.reshape(b, length), cfg.mask_token_id, x)
  t = jnp.broadcast_to(k / jnp.maximum(n, 1.0), tgt.shape).reshape(b, length)
  return xt, t


def _noised(cfg: ObjectiveConfig, x, target, t_rng, mask_rng, block: int, *, train: bool):
  """(x_t, t [B, L]): the 1/t NELBO's draw (t per block of `block`, each target masked with
  probability t), or `_mask_counts`' in eval with cfg.eval_mask_counts."""
  if cfg.eval_mask_counts and not train:
    return _mask_counts(cfg, x, target, mask_rng, block)
  b, length = x.shape
  antithetic = train and cfg.antithetic
  t = orders.sample_mask_times(t_rng, b, length, block, antithetic=antithetic, eps=cfg.sampling_eps)
  return _mask_at_times(cfg, x, target, t, mask_rng), t


def _masked_nll(cfg: ObjectiveConfig, forward, model, params, x, xt):
  """Per-token NLL at masked positions; copy-over gives log p(x_t) = 0 elsewhere (SPEC §1.6).

  `forward(**extra)` runs the backbone (see `fused_head.token_nll`)."""
  nll = fused_head.token_nll(forward, model, params, x, suppress_id=cfg.mask_token_id)
  is_masked = xt == cfg.mask_token_id
  return jnp.where(is_masked, nll, 0.0), is_masked


def _diffusion_reduce(cfg: ObjectiveConfig, nll, is_masked, target, t, *, train: bool):
  """Training: unweighted CE / #masked. Eval: the 1/t NELBO per real token (BOS dropped)."""
  weight = target.astype(jnp.float32)
  if train:
    return _reduce(nll, weight, jnp.sum(is_masked, -1).astype(jnp.float32))
  if cfg.keep_clean_bos:
    nll, weight, t = nll[:, 1:], weight[:, 1:], t[:, 1:]
  return _reduce(nll / t, weight, jnp.sum(weight, -1))


def mdlm_loss(cfg: ObjectiveConfig, model: Backbone, params, batch, rng, *, train: bool):
  """MDLM: one t per sequence, bidirectional attention over x_t (SPEC §1.6)."""
  x, real, target = _batch_masks(batch)
  length = x.shape[1]
  t_rng, mask_rng, _, dropout_rng = jax.random.split(rng, 4)  # the BD3LM split, for equal draws
  xt, t = _noised(cfg, x, target, t_rng, mask_rng, length, train=train)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), x.shape)
  forward = functools.partial(
    _apply, model, params, xt, positions, masks.padding_mask(real), train=train, rng=dropout_rng
  )
  nll, is_masked = _masked_nll(cfg, forward, model, params, x, xt)
  return _diffusion_reduce(cfg, nll, is_masked, target, t, train=train)


def remask_empty_blocks(rng, xt, target, x, cfg: ObjectiveConfig):
  """BD3LM training: a block with no M whose tokens are all targets gets 1..S random tokens masked.

  `target` [B, L] is real & ~context: a block touched by padding *or by context* is left alone,
  as the reference (its `noise_mask` is context | pad; SPEC §1.6 masking step 3), so a block that
  mixes prompt and answer tokens is never re-masked.
  """
  b, length = xt.shape
  s = cfg.block_size
  nb = length // s
  blocks = lambda a: a.reshape(b, nb, s)
  empty = ~jnp.any(blocks(xt == cfg.mask_token_id), -1) & jnp.all(blocks(target), -1)  # [B, nb]
  count_rng, subset_rng = jax.random.split(rng)
  count = jax.random.randint(count_rng, (b, nb, 1), 0, s) + 1  # n + 1 in 1..S
  rank = jnp.argsort(jnp.argsort(jax.random.uniform(subset_rng, (b, nb, s)), -1), -1)
  new = (rank < count) & empty[..., None]
  xt = jnp.where(new.reshape(b, length), cfg.mask_token_id, xt)
  if cfg.keep_clean_bos:
    xt = xt.at[:, 0].set(x[:, 0])
  return xt


def bd3lm_loss(cfg: ObjectiveConfig, model: Backbone, params, batch, rng, *, train: bool):
  """BD3LM: one t per block, two streams [x, x_t] under the block-causal mask (SPEC §1.6).

  Training re-masks blocks that came out with no mask, so every block carries loss.
  """
  x, real, target = _batch_masks(batch)
  length = x.shape[1]
  t_rng, mask_rng, remask_rng, dropout_rng = jax.random.split(rng, 4)
  xt, t = _noised(cfg, x, target, t_rng, mask_rng, cfg.block_size, train=train)
  if train:
    xt = remask_empty_blocks(remask_rng, xt, target, x, cfg)
    xt = jnp.where(real & ~target, x, xt)  # context tokens are never masked (SPEC §1.6)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), x.shape)
  static = masks.block_causal_mask(length, cfg.block_size)
  mask = attention.for_model(
    model, jnp.asarray(static)[None] & masks.padding_mask(jnp.concatenate([real, real], -1)), static
  )  # + tiles for blocksparse / splash
  forward = functools.partial(
    _apply,
    model,
    params,
    jnp.concatenate([x, xt], -1),
    jnp.concatenate([positions, positions], -1),
    mask,
    train=train,
    rng=dropout_rng,
    head_start=length,
  )
  nll, is_masked = _masked_nll(cfg, forward, model, params, x, xt)
  return _diffusion_reduce(cfg, nll, is_masked, target, t, train=train)


__all__ = [
  "ObjectiveConfig",
  "setdlm_loss",
  "setdlm_inputs",
  "setdlm_order",
  "ar_loss",
  "mdlm_loss",
  "bd3lm_loss",
  "remask_empty_blocks",
]
