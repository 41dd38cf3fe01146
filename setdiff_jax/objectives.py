"""Training objectives and likelihood bounds: SetDLM, AR, MDLM, BD3LM (SPEC §1.4, §1.6).

All share the backbone and return `(loss, metrics)`:
  loss     scalar: per-sequence mean, then batch mean (as the reference).
  metrics  {"loss", "nll_sum", "num_tokens", "num_sequences"}: summed over the batch, so a
           dataset-level NLL is sum(nll_sum) / sum(num_tokens), comparable across methods.

Batches are dicts of arrays [B, L]: `tokens` int, `attention_mask` (1 real, 0 pad), optional
`context_mask` (1 for prompt tokens that are never targets) and, for SetDLM, an optional `order`
int [B, L] that overrides the sampled order (tests, K-order evaluation).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from setdiff_jax import masks, orders
from setdiff_jax.model import DiT, suppress_mask_logit

OBJECTIVES = ("setdlm", "ar", "mdlm", "bd3lm")
Metrics = Dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """What distinguishes the methods; the backbone is shared."""
  name: str = "setdlm"
  mask_token_id: int = 103
  pad_token_id: int = 0
  eos_token_id: int = 102
  keep_clean_bos: bool = True       # position 0 first in order, never masked, dropped in eval
  desired_set_size: int = 4         # SetDLM S
  max_set_size: Optional[int] = None  # SetDLM S_max (None = 2S)
  eos_last: bool = False            # setdlm_eos_last_in_target_order (training only)
  block_size: int = 4               # BD3LM block S
  antithetic: bool = False          # antithetic t (MDLM/BD3LM training)
  sampling_eps: float = 1e-3        # t = (1 - eps) u + eps

  def __post_init__(self):
    if self.name not in OBJECTIVES:
      raise ValueError(f"objective={self.name!r}; expected one of {OBJECTIVES}")

  @classmethod
  def from_config(cls, cfg) -> "ObjectiveConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cfg).items() if k in names})

  def validate(self, seq_len: int):
    """Raises ValueError naming the conflicting fields."""
    if self.name == "setdlm":
      orders.staggered_params(seq_len, self.desired_set_size, self.max_set_size)
    if self.name == "bd3lm" and seq_len % self.block_size:
      raise ValueError(f"objective=bd3lm needs block_size={self.block_size} to divide seq_len={seq_len}")


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
  return loss, {"loss": loss, "nll_sum": jnp.sum(nll_sum), "num_tokens": jnp.sum(denom),
                "num_sequences": jnp.asarray(nll.shape[0], jnp.float32)}


def _apply(model: DiT, params, tokens, positions, mask, *, train: bool, rng, **kwargs):
  rngs = {"dropout": rng} if train else {}
  return model.apply({"params": params}, tokens, positions, mask, deterministic=not train,
                     rngs=rngs, **kwargs)


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
  return {"tokens": jnp.concatenate([xs, ns], -1), "positions": jnp.concatenate([order, order], -1),
          "mask": mask, "targets": xs, "target_weight": take(target)}


def setdlm_order(cfg: ObjectiveConfig, batch, rng, *, train: bool) -> jax.Array:
  """Samples the staggered order of SPEC §1.2 (or returns `batch['order']`)."""
  if "order" in batch:
    return batch["order"].astype(jnp.int32)
  x, _, target = _batch_masks(batch)
  permutable = target.at[:, 0].set(False) if cfg.keep_clean_bos else target
  order = orders.sample_order(rng, permutable, kind="staggered",
                              desired_set_size=cfg.desired_set_size, max_set_size=cfg.max_set_size)
  if train and cfg.eos_last:
    order = orders.move_eos_last(order, x, target, cfg.eos_token_id)
  return order


def setdlm_loss(cfg: ObjectiveConfig, model: DiT, params, batch, rng, *, train: bool):
  """SetDLM loss (train) or one-order likelihood bound (eval), SPEC §1.4-1.5."""
  order_rng, dropout_rng = jax.random.split(rng)
  order = setdlm_order(cfg, batch, order_rng, train=train)
  inp = setdlm_inputs(cfg, batch, order)
  length = order.shape[-1]
  logits = _apply(model, params, inp["tokens"], inp["positions"], inp["mask"], train=train,
                  rng=dropout_rng, head_start=length)  # noisy half only
  logp = jax.nn.log_softmax(suppress_mask_logit(logits, cfg.mask_token_id), axis=-1)
  nll = -jnp.take_along_axis(logp, inp["targets"][..., None], axis=-1)[..., 0]
  weight = inp["target_weight"]
  if not train:
    if cfg.keep_clean_bos:
      weight = weight.at[:, 0].set(False)  # the first slot in order is the clean BOS
    weight = weight & (inp["targets"] != cfg.pad_token_id)
  weight = weight.astype(jnp.float32)
  return _reduce(nll, weight, jnp.sum(weight, -1))


# --------------------------------------------------------------------------------- AR
def ar_loss(cfg: ObjectiveConfig, model: DiT, params, batch, rng, *, train: bool):
  """Shifted next-token NLL, causal attention, no M suppression (SPEC §1.6)."""
  x, real, target = _batch_masks(batch)
  inputs = x[:, :-1]
  n = inputs.shape[-1]
  positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), inputs.shape)
  mask = jnp.asarray(masks.causal_mask(n))[None]
  logits = _apply(model, params, inputs, positions, mask, train=train, rng=rng)
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, x[:, 1:, None], axis=-1)[..., 0]
  # Label x_{j+1} is weighted by the *input-side* mask a_j (1 - c_j), as the reference: the first
  # pad after the text is a counted target (the model learns to stop there).
  weight = target[:, :-1].astype(jnp.float32)
  return _reduce(nll, weight, jnp.sum(weight, -1))


# --------------------------------------------------------------------------------- MDLM / BD3LM
def sample_t(cfg: ObjectiveConfig, rng, batch_size: int, length: int, block: int, *, train: bool):
  """Per-token diffusion time [B, L]: one draw per block of `block` tokens (SPEC §1.6)."""
  num_blocks = -(-length // block)
  u = jax.random.uniform(rng, (batch_size, num_blocks))
  if train and cfg.antithetic:
    g = batch_size
    u = jnp.mod(u / g + jnp.arange(g, dtype=jnp.float32)[:, None] / g, 1.0)
  t = (1.0 - cfg.sampling_eps) * u + cfg.sampling_eps
  return jnp.repeat(t, block, axis=-1)[:, :length]


def remask_empty_blocks(rng, xt, real, x, cfg: ObjectiveConfig):
  """BD3LM training: a block with no M and no padding gets 1..S random tokens masked (SPEC §1.6)."""
  b, length = xt.shape
  s = cfg.block_size
  nb = length // s
  blocks = lambda a: a.reshape(b, nb, s)
  empty = ~jnp.any(blocks(xt == cfg.mask_token_id), -1) & jnp.all(blocks(real), -1)  # [B, nb]
  count_rng, subset_rng = jax.random.split(rng)
  count = jax.random.randint(count_rng, (b, nb, 1), 0, s) + 1  # n + 1 in 1..S
  rank = jnp.argsort(jnp.argsort(jax.random.uniform(subset_rng, (b, nb, s)), -1), -1)
  new = (rank < count) & empty[..., None]
  xt = jnp.where(new.reshape(b, length), cfg.mask_token_id, xt)
  if cfg.keep_clean_bos:
    xt = xt.at[:, 0].set(x[:, 0])
  return xt


def masked_diffusion_loss(cfg: ObjectiveConfig, model: DiT, params, batch, rng, *, train: bool):
  """MDLM (bidirectional on x_t) or BD3LM (two streams [x, x_t], block mask); SPEC §1.6.

  Training: unweighted CE over masked tokens / number of masked tokens. Eval: the 1/t NELBO per
  real token (BOS dropped under keep_clean_bos).
  """
  x, real, target = _batch_masks(batch)
  bsz, length = x.shape
  block = cfg.block_size if cfg.name == "bd3lm" else length
  t_rng, mask_rng, remask_rng, dropout_rng = jax.random.split(rng, 4)
  t = sample_t(cfg, t_rng, bsz, length, block, train=train)
  xt = jnp.where((jax.random.uniform(mask_rng, x.shape) < t) & target, cfg.mask_token_id, x)
  if cfg.keep_clean_bos:
    xt = xt.at[:, 0].set(x[:, 0])
  if cfg.name == "bd3lm" and train:
    xt = remask_empty_blocks(remask_rng, xt, real, x, cfg)
    xt = jnp.where(real & ~target, x, xt)  # context tokens are never masked (SPEC §1.6)

  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), x.shape)
  if cfg.name == "mdlm":
    logits = _apply(model, params, xt, positions, masks.padding_mask(real), train=train,
                    rng=dropout_rng)
  else:
    mask = (jnp.asarray(masks.block_causal_mask(length, cfg.block_size))[None]
            & masks.padding_mask(jnp.concatenate([real, real], -1)))
    logits = _apply(model, params, jnp.concatenate([x, xt], -1),
                    jnp.concatenate([positions, positions], -1), mask, train=train,
                    rng=dropout_rng, head_start=length)
  logp = jax.nn.log_softmax(suppress_mask_logit(logits, cfg.mask_token_id), axis=-1)
  is_masked = xt == cfg.mask_token_id
  # Copy-over: unmasked positions have log p(x_t) = 0, so only masked positions carry loss.
  nll = jnp.where(is_masked, -jnp.take_along_axis(logp, x[..., None], axis=-1)[..., 0], 0.0)
  weight = target.astype(jnp.float32)
  if train:
    return _reduce(nll, weight, jnp.sum(is_masked, -1).astype(jnp.float32))
  if cfg.keep_clean_bos:
    nll, weight, t = nll[:, 1:], weight[:, 1:], t[:, 1:]
  return _reduce(nll / t, weight, jnp.sum(weight, -1))


# --------------------------------------------------------------------------------- dispatch
LOSSES: Dict[str, Callable[..., Tuple[jax.Array, Metrics]]] = {
    "setdlm": setdlm_loss, "ar": ar_loss, "mdlm": masked_diffusion_loss,
    "bd3lm": masked_diffusion_loss,
}


def compute_loss(cfg: ObjectiveConfig, model: DiT, params, batch, rng, *, train: bool):
  """The objective's training loss (train=True) or likelihood bound (train=False)."""
  return LOSSES[cfg.name](cfg, model, params, batch, rng, train=train)


__all__ = [
    "OBJECTIVES", "ObjectiveConfig", "compute_loss", "setdlm_loss", "setdlm_inputs", "setdlm_order",
    "ar_loss", "masked_diffusion_loss", "sample_t", "remask_empty_blocks",
]
