"""A PyTorch reference of the DiT backbone, written from SPEC §3, for logits parity.

Its code needs only torch (CPU build) and numpy (the key map and weight files it reads are
`setdiff_jax.interop`'s, which load jax). Its module tree reproduces the official
`DIT` state-dict names (SPEC §3.9), so an exported or official checkpoint directory loads with
`load_state_dict(strict=True)` after stripping the `backbone.` prefix: an independent check of the
name map in `name_map.py`.

  model = load_reference(path)                          # exported/official directory -> TorchDiT
  logits = model(tokens, positions, allowed)            # two-stream training input, [B, S, V]
  kv = model.encode(tokens, positions, valid)           # clean prompt/committed tokens -> KV cache
  logits = model.cached_step(kv, cache_valid, pending_tokens, pending_positions, pending_valid,
                             mask_positions, mask_valid, mask_id)   # one decoding step (SPEC §2.8)
  forward_logits(config, params, tokens, positions, allowed)  # from *our* params (numpy out)

Semantics follow SPEC §3.2-3.5: no input scaling or positional embedding; LayerNorm with weight
only (eps 1e-5, fp32); fused QKV with output layout (3, H, Dh); half-split RoPE on absolute
position ids; SDPA with an additive float mask (0 allowed, float32 min otherwise, so a fully
masked row is uniform rather than NaN); GELU(tanh) MLP; untied head; optional adaLN with
sigma = 0. Logits are raw (no mask-token suppression; see `models.layers.suppress_mask_logit`).
"""

from __future__ import annotations

import math
import os
from typing import List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from setdiff_jax.interop import backbone_config, name_map
from setdiff_jax.interop import weight_files


def _t(a) -> torch.Tensor:
  """A tensor from a tensor, numpy or jax array (copied, so read-only buffers are fine)."""
  return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.array(a))


KV = List[Tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [B, C, H, Dh], k after RoPE
NEG_INF_LOGIT = -1e12  # = models.layers.NEG_INF_LOGIT; a copy, as this module never imports jax


# ----------------------------------------------------------------------------- layers
class LayerNorm(nn.Module):
  """Weight only, no bias; computed in fp32 and cast back."""

  def __init__(self, dim: int, eps: float = 1e-5):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(dim))
    self.eps = eps

  def forward(self, x):
    y = F.layer_norm(x.float(), (x.shape[-1],), weight=self.weight.float(), eps=self.eps)
    return y.to(x.dtype)


class Embedding(nn.Module):
  def __init__(self, vocab: int, dim: int):
    super().__init__()
    self.embedding = nn.Parameter(torch.empty(vocab, dim))
    bound = 1.0 / math.sqrt(dim)
    nn.init.uniform_(self.embedding, -bound, bound)

  def forward(self, ids):
    return self.embedding[ids]


class Rotary(nn.Module):
  """Holds the persistent `inv_freq` buffer; cos/sin are computed from absolute position ids."""

  def __init__(self, head_dim: int, base: float = 10000.0):
    super().__init__()
    self.register_buffer("inv_freq", torch.from_numpy(name_map.rotary_inv_freq(head_dim, base)))

  def forward(self, positions):
    theta = positions.to(torch.float32)[..., None] * self.inv_freq.float()  # [B, S, Dh/2]
    theta = torch.cat([theta, theta], dim=-1)
    return theta.cos(), theta.sin()


def rotate(x, cos, sin):
  """x [B, S, H, Dh]; z cos + [-z2; z1] sin, in x's dtype."""
  half = x.shape[-1] // 2
  rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
  return x * cos[:, :, None].to(x.dtype) + rot * sin[:, :, None].to(x.dtype)


class TimestepEmbedder(nn.Module):
  def __init__(self, cond_dim: int, freq_dim: int = name_map.TIME_EMBED_DIM):
    super().__init__()
    self.freq_dim = freq_dim
    self.mlp = nn.Sequential(
      nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim)
    )

  def forward(self, t):
    half = self.freq_dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return self.mlp(torch.cat([args.cos(), args.sin()], dim=-1))


class Block(nn.Module):
  def __init__(
    self, dim: int, heads: int, mlp_ratio: int, cond_dim: int, adaln: bool, dropout: float
  ):
    super().__init__()
    self.heads, self.dropout, self.adaln = heads, dropout, adaln
    self.norm1 = LayerNorm(dim)
    self.attn_qkv = nn.Linear(dim, 3 * dim, bias=False)
    self.attn_out = nn.Linear(dim, dim, bias=False)
    self.norm2 = LayerNorm(dim)
    self.mlp = nn.Sequential(
      nn.Linear(dim, mlp_ratio * dim), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * dim, dim)
    )
    if adaln:
      self.adaLN_modulation = nn.Linear(cond_dim, 6 * dim)

  def forward(self, h, cos, sin, bias, cond, past: Optional[Tuple[torch.Tensor, torch.Tensor]]):
    b, s, d = h.shape
    if self.adaln:
      mods = self.adaLN_modulation(cond)[:, None].chunk(6, dim=-1)
      shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
    a = self.norm1(h)
    if self.adaln:
      a = a * (1 + scale_msa) + shift_msa
    qkv = self.attn_qkv(a).view(b, s, 3, self.heads, d // self.heads)
    q, k, v = qkv.unbind(dim=2)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    new_kv = (k, v)
    if past is not None:
      k = torch.cat([past[0].to(k.dtype), k], dim=1)
      v = torch.cat([past[1].to(v.dtype), v], dim=1)
    o = F.scaled_dot_product_attention(
      q.transpose(1, 2),
      k.transpose(1, 2),
      v.transpose(1, 2),
      attn_mask=bias.to(q.dtype),
      dropout_p=0.0,
      scale=1.0 / math.sqrt(q.shape[-1]),
    )
    o = self.attn_out(o.transpose(1, 2).reshape(b, s, d))
    if self.adaln:
      o = gate_msa * o
    h = h + F.dropout(o, p=self.dropout, training=self.training)
    a = self.norm2(h)
    if self.adaln:
      a = a * (1 + scale_mlp) + shift_mlp
    m = self.mlp(a)
    if self.adaln:
      m = gate_mlp * m
    h = h + F.dropout(m, p=self.dropout, training=self.training)
    return h, new_kv


class FinalLayer(nn.Module):
  def __init__(self, dim: int, vocab: int, cond_dim: int, adaln: bool):
    super().__init__()
    self.adaln = adaln
    self.norm_final = LayerNorm(dim)
    self.linear = nn.Linear(dim, vocab)
    nn.init.zeros_(self.linear.weight)
    nn.init.zeros_(self.linear.bias)
    if adaln:
      self.adaLN_modulation = nn.Linear(cond_dim, 2 * dim)

  def forward(self, h, cond):
    h = self.norm_final(h)
    if self.adaln:
      shift, scale = self.adaLN_modulation(cond)[:, None].chunk(2, dim=-1)
      h = h * (1 + scale) + shift
    return self.linear(h)


def additive_mask(allowed: torch.Tensor) -> torch.Tensor:
  """bool [B, Sq, Sk] (or [B, 1, Sq, Sk]) -> float [B, 1, Sq, Sk]: 0 allowed, float32 min else."""
  allowed = allowed.to(torch.bool)
  if allowed.dim() == 3:
    allowed = allowed[:, None]
  zero = torch.zeros((), dtype=torch.float32)
  return torch.where(allowed, zero, torch.tensor(torch.finfo(torch.float32).min))


class TorchDiT(nn.Module):
  """The DiT backbone (SPEC §3); module names = the official `DIT` state dict."""

  def __init__(
    self,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    mlp_ratio: int = 4,
    cond_dim: int = 128,
    adaln: bool = False,
    dropout: float = 0.0,
    rope_base: float = 10000.0,
  ):
    super().__init__()
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
      raise ValueError(f"hidden_size={hidden_size} / num_heads={num_heads} must be an even integer")
    self.adaln = adaln
    self.num_heads = num_heads
    self.vocab_embed = Embedding(vocab_size, hidden_size)
    if adaln:
      self.sigma_map = TimestepEmbedder(cond_dim)
    self.rotary_emb = Rotary(hidden_size // num_heads, rope_base)
    self.blocks = nn.ModuleList(
      [
        Block(hidden_size, num_heads, mlp_ratio, cond_dim, adaln, dropout)
        for _ in range(num_layers)
      ]
    )
    self.output_layer = FinalLayer(hidden_size, vocab_size, cond_dim, adaln)
    self.eval()

  @classmethod
  def from_dims(cls, dims: name_map.Dims, num_heads: int, **kw) -> "TorchDiT":
    return cls(
      dims.vocab_size,
      dims.hidden_size,
      dims.num_layers,
      num_heads,
      dims.mlp_ratio,
      dims.cond_dim,
      dims.adaln,
      **kw,
    )

  def forward(
    self,
    tokens,
    positions,
    allowed,
    kv_cache: Optional[KV] = None,
    sigma=None,
    return_kv: bool = False,
  ):
    """tokens, positions int [B, S]; allowed bool [B, S, C + S] (True = query attends to key);
    kv_cache per layer (k, v) [B, C, H, Dh]. Returns fp32 logits [B, S, V] (and this call's kv)."""
    tokens, positions = _t(tokens).long(), _t(positions).long()
    h = self.vocab_embed(tokens)
    cos, sin = self.rotary_emb(positions)
    bias = additive_mask(_t(allowed))
    cond = None
    if self.adaln:
      if sigma is None:
        sigma = torch.zeros(tokens.shape[0], dtype=torch.float32)
      cond = F.silu(self.sigma_map(_t(sigma)))
    new = []
    for i, block in enumerate(self.blocks):
      h, kv = block(h, cos, sin, bias, cond, None if kv_cache is None else kv_cache[i])
      new.append(kv)
    logits = self.output_layer(h, cond).float()
    return (logits, new) if return_kv else logits

  # --------------------------------------------------------------------- decoding helpers
  @torch.no_grad()
  def encode(self, tokens, positions, valid=None) -> KV:
    """KV cache of committed clean tokens (in commit order), clean-causal mask (SPEC §2.8)."""
    tokens = _t(tokens).long()
    b, n = tokens.shape
    valid = torch.ones(b, n, dtype=torch.bool) if valid is None else _t(valid).bool()
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))[None] & valid[:, None, :]
    allowed = allowed | torch.eye(n, dtype=torch.bool)[None]
    _, kv = self(tokens, positions, allowed, return_kv=True)
    return kv

  @torch.no_grad()
  def cached_step(
    self,
    kv_cache: KV,
    cache_valid,
    pending_tokens,
    pending_positions,
    pending_valid,
    mask_positions,
    mask_valid,
    mask_id: int,
  ):
    """One KV-cached decoding step: inputs [pending clean tokens | active masks]; returns
    (logits of every step row [B, P + A, V], this step's kv [B, P + A, H, Dh] per layer)."""
    pending_tokens = _t(pending_tokens).long()
    mask_positions = _t(mask_positions).long()
    b, a = mask_positions.shape
    tokens = torch.cat([pending_tokens, torch.full((b, a), mask_id, dtype=torch.long)], dim=1)
    positions = torch.cat([_t(pending_positions).long(), mask_positions], dim=1)
    allowed = torch.from_numpy(
      cached_step_mask(np.asarray(cache_valid), np.asarray(pending_valid), np.asarray(mask_valid))
    )
    return self(tokens, positions, allowed, kv_cache=kv_cache, return_kv=True)


# ----------------------------------------------------------------------------- masks (numpy)
def set_causal_mask(length: int) -> np.ndarray:
  """Two-stream set-causal mask bool [2L, 2L] (SPEC §2.2), clean stream first."""
  slot = np.arange(2 * length)
  r, noisy = slot % length, slot >= length
  rq, rk, nq, nk = r[:, None], r[None], noisy[:, None], noisy[None]
  return (~nq & ~nk & (rk <= rq)) | (nq & ~nk & (rk < rq)) | (nq & nk & (rk == rq))


def cached_step_mask(cache_valid, pending_valid, active_valid) -> np.ndarray:
  """bool [B, P + A, C + P + A] of SPEC §2.8: pending tokens see the cache and earlier-or-same
  pending tokens; masks see the cache, all pending tokens and themselves. Invalid keys are
  excluded; every row keeps its own diagonal so no row is empty."""
  cache_valid = np.asarray(cache_valid, bool)
  pending_valid = np.asarray(pending_valid, bool)
  active_valid = np.asarray(active_valid, bool)
  p, a = pending_valid.shape[-1], active_valid.shape[-1]
  q = np.arange(p + a)
  is_mask = q >= p
  own = np.where(is_mask[:, None], (q[None] < p) | (q[None] == q[:, None]), q[None] <= q[:, None])
  valid = np.concatenate([pending_valid, active_valid], -1)
  own = (own[None] & valid[:, None, :]) | np.eye(p + a, dtype=bool)[None]
  cache = np.broadcast_to(
    cache_valid[:, None, :], (cache_valid.shape[0], p + a, cache_valid.shape[-1])
  )
  return np.concatenate([cache, own], axis=-1)


# ----------------------------------------------------------------------------- likelihood bound
@torch.no_grad()
def setdlm_likelihood_bound(
  model: TorchDiT,
  tokens,
  order,
  attention_mask,
  *,
  mask_id: int,
  pad_id: int,
  keep_clean_bos: bool = True,
  context_mask=None,
):
  """One-order SetDLM NLL bound (SPEC §1.4-1.5, eval mode) for a given order [B, L].

  Builds the two-stream input (clean stream x_sigma, noisy stream with M on target tokens, both at
  their original positions), the set-causal mask with the padding permuted by the order, suppresses
  M, and averages the NLL over real non-pad target tokens per sequence (the first ranked slot
  dropped under keep_clean_bos), then over the batch. Returns (loss, nll_sum, num_tokens).
  """
  x, order, real = _t(tokens).long(), _t(order).long(), _t(attention_mask).bool()
  ctx = torch.zeros_like(real) if context_mask is None else _t(context_mask).bool()
  target = real & ~ctx
  length = x.shape[1]
  noisy = torch.where(target, torch.full_like(x, mask_id), x)
  take = lambda t: torch.gather(t, 1, order)
  xs, ns, real_s, target_s = take(x), take(noisy), take(real), take(target)
  inp = torch.cat([xs, ns], 1)
  pos = torch.cat([order, order], 1)
  valid = torch.cat([real_s, real_s], 1)
  allowed = torch.from_numpy(set_causal_mask(length))[None] & valid[:, :, None] & valid[:, None, :]
  logits = model(inp, pos, allowed)[:, length:]
  logits[..., mask_id] = NEG_INF_LOGIT
  nll = -torch.gather(F.log_softmax(logits, -1), 2, xs[..., None])[..., 0]
  weight = target_s.clone()
  if keep_clean_bos:
    weight[:, 0] = False
  weight = (weight & (xs != pad_id)).float()
  nll_sum = (weight * nll).sum(-1)
  denom = weight.sum(-1)
  per_seq = torch.where(denom > 0, nll_sum / denom.clamp_min(1e-30), torch.zeros_like(nll_sum))
  return per_seq.mean().item(), nll_sum.sum().item(), denom.sum().item()


# ----------------------------------------------------------------------------- loading
def load_reference(path: str, *, strict: bool = True) -> TorchDiT:
  """A TorchDiT with the weights of an exported or official checkpoint directory.

  The model's `hf_config` attribute holds the parsed config.json. Raises on missing or unexpected
  backbone keys (strict load); ignores the denoiser's `static_attention_mask`.
  """
  cfg = weight_files.read_json(os.path.join(path, weight_files.CONFIG_FILE))
  bb = backbone_config.backbone_fields(cfg)
  state = name_map.strip_prefix(weight_files.read_state_dict(path))
  for k in name_map.IGNORED_BUFFERS:
    state.pop(k, None)
  model = TorchDiT(
    int(bb["vocab_size"]),
    int(bb["hidden_size"]),
    int(bb["num_layers"]),
    int(bb["num_heads"]),
    bb["mlp_ratio"],
    int(bb["cond_dim"]),
    bb["adaln"],
    rope_base=bb["rope_base"],
  )
  tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).float() for k, v in state.items()}
  if name_map.ROTARY_KEY not in tensors:  # an export without the buffer: keep the computed one
    tensors[name_map.ROTARY_KEY] = model.rotary_emb.inv_freq.clone()
  model.load_state_dict(tensors, strict=strict)
  model.hf_config = cfg
  return model.eval()


def _field(cfg, key, default=None):
  if cfg is None:
    return default
  if isinstance(cfg, Mapping):
    return cfg.get(key, default)
  try:
    return cfg[key] if key in cfg else getattr(cfg, key, default)
  except TypeError:
    return getattr(cfg, key, default)


def model_from_params(config, params) -> TorchDiT:
  """A TorchDiT holding *our* parameters (nested dict, numpy or jax arrays), via the name map.

  `config`: our run ConfigDict (uses `config.model`), a `DiTConfig`, or a mapping of DiT fields;
  only `num_heads` (and `rope_base`) cannot be read off the parameter shapes.
  """
  model_cfg = _field(config, "model", None) or config
  dims = name_map.dims_from_params(params, cond_dim=_field(model_cfg, "cond_dim", None))
  heads = _field(model_cfg, "num_heads", None)
  if heads is None:
    raise ValueError("config has no num_heads (model.num_heads)")
  for key, got in (("hidden_size", dims.hidden_size), ("num_layers", dims.num_layers)):
    want = _field(model_cfg, key, None)
    if want not in (None, 0) and int(want) != got:
      raise ValueError(f"config {key}={want} but the parameters have {got}")
  rope_base = float(_field(model_cfg, "rope_base", 10000.0) or 10000.0)
  model = TorchDiT.from_dims(dims, int(heads), rope_base=rope_base)
  state = name_map.flax_to_torch(params, dims)
  tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}
  tensors[name_map.ROTARY_KEY] = model.rotary_emb.inv_freq.clone()
  model.load_state_dict(tensors, strict=True)
  return model.eval()


def forward_logits(
  config, params, tokens, positions, allowed, *, kv_cache=None, sigma=None, return_kv: bool = False
):
  """Raw backbone logits float32 [B, S, V] of our (config, params) computed by the PyTorch
  reference, dropout off: what the official `DIT` computes for the same inputs.

  tokens, positions: int [B, S]; allowed: bool [B, S, C + S] (True = query may attend to key);
  kv_cache: optional per-layer (k, v) [B, C, H, Dh] (numpy or torch). Returns numpy.
  """
  model = model_from_params(config, params)
  cache = None if kv_cache is None else [(_t(k).float(), _t(v).float()) for k, v in kv_cache]
  with torch.no_grad():
    out = model(tokens, positions, allowed, kv_cache=cache, sigma=sigma, return_kv=return_kv)
  if return_kv:
    logits, kv = out
    return logits.numpy(), [(k.numpy(), v.numpy()) for k, v in kv]
  return out.numpy()


__all__ = [
  "TorchDiT",
  "load_reference",
  "model_from_params",
  "forward_logits",
  "setdlm_likelihood_bound",
  "set_causal_mask",
  "cached_step_mask",
  "additive_mask",
]
