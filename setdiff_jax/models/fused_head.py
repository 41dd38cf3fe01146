"""Fused output head + cross-entropy with a custom VJP: the same NLL, far less memory traffic.

The plain path computes logits [N, V] = h W + b, copies them to suppress the mask token,
log-softmaxes into a second fp32 [N, V] array, gathers the targets, and in the backward pass
scatters into a zero [N, V] array and runs the log-softmax and `.at[].set` transposes, each a pass
over N x V floats (1 GB-class traffic at B = 16, L = 128, V = 30,522). Here, per chunk of rows:

  forward   z = h W + b (compute dtype, then fp32; the suppressed column set to -1e12 inside the
            reduction, never as a copy); lse = logsumexp(z); nll = lse - z[target].
  backward  dz = g * (softmax(z) - onehot(target)) (0 in the suppressed column) in one fused pass;
            dh = dz W^T, dW = h^T dz, db = sum(dz).

`recompute=False` keeps the chunk's fp32 logits as the only [N, V] residual (one extra read in the
backward pass); `recompute=True` recomputes them (one more h W matmul, no [N, V] residual at all),
for long sequences or large vocabularies where memory, not the CPU, is the limit.

`vocab_chunk` (the backbones' default `head_vocab_chunk = 1024`) instead walks the vocabulary in
column chunks: an online logsumexp forward and a backward that recomputes each chunk's logits and
takes dW of that chunk over all rows in one matmul. Four h W-sized matmuls instead of three, but
no [N, V] array at all, and each chunk's [N, chunk] logits stay in the cache: on the 2-core CPU
the head's forward + backward at N = 2032, D = 256 is 1.15x (V = 4,096) to 1.45x (V = 151,936)
faster than the row path (`benchmarks/README.md`).

Backbones hand it their final hidden states and head weights: a backbone that supports the fused
head accepts `return_hidden=True` (returns the hidden states that would enter the head, rows
[head_start:]) and has `output_head(params) -> (kernel [D, V], bias [V] or None)`. `token_nll`
uses it when `config.fused_head` is set and falls back to logits otherwise.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from setdiff_jax.models.layers import NEG_INF_LOGIT, suppress_mask_logit


def head_logits(h, kernel, bias, dtype):
  """fp32 [..., V] logits exactly as `dit.Linear` + `.astype(float32)` computes them (also the
  RL scorer's chunked head, `rl.scoring.head_scores`)."""
  z = jnp.dot(h.astype(dtype), kernel.astype(dtype))
  if bias is not None:
    z = z + bias.astype(dtype)
  return z.astype(jnp.float32)


def _suppress(z, suppress_id):
  if suppress_id is None:
    return z
  col = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
  return jnp.where(col == suppress_id, NEG_INF_LOGIT, z)


def _chunk_forward(h, t, kernel, bias, dtype, suppress_id):
  z = _suppress(head_logits(h, kernel, bias, dtype), suppress_id)
  mx = jnp.max(z, axis=-1, keepdims=True)
  lse = (mx + jnp.log(jnp.sum(jnp.exp(z - mx), axis=-1, keepdims=True)))[:, 0]
  zt = jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0]
  return lse - zt, lse, z


def _chunk_dz(z, lse, t, g, suppress_id):
  """g * (softmax - onehot), fp32 [n, V]; 0 in the suppressed column (its logit is a constant)."""
  col = jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
  dz = jnp.exp(z - lse[:, None]) - (col == t[:, None]).astype(jnp.float32)
  if suppress_id is not None:
    dz = jnp.where(col == suppress_id, 0.0, dz)
  return dz * g[:, None]


def _split(x, chunk: int):
  """[N, ...] -> [N / chunk, chunk, ...] (N is padded by the caller)."""
  return x.reshape((x.shape[0] // chunk, chunk) + x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _nll_rows(h, targets, kernel, bias, dtype, suppress_id, chunk, recompute):
  return _nll_fwd(h, targets, kernel, bias, dtype, suppress_id, chunk, recompute)[0]


def _nll_fwd(h, targets, kernel, bias, dtype, suppress_id, chunk, recompute):
  def one(args):
    hc, tc = args
    nll, lse, z = _chunk_forward(hc, tc, kernel, bias, dtype, suppress_id)
    return nll, lse, (None if recompute else z)

  if chunk >= h.shape[0]:
    nll, lse, z = one((h, targets))
  else:
    nll, lse, z = jax.lax.map(one, (_split(h, chunk), _split(targets, chunk)))
    nll, lse = nll.reshape(-1), lse.reshape(-1)
  return nll, (h, targets, kernel, bias, lse, z)


def _nll_bwd(dtype, suppress_id, chunk, recompute, res, g):
  h, targets, kernel, bias, lse, z = res
  k = kernel.astype(dtype)

  def grads(hc, tc, lc, gc, zc):
    if zc is None:
      zc = _suppress(head_logits(hc, kernel, bias, dtype), suppress_id)
    dz = _chunk_dz(zc, lc, tc, gc, suppress_id).astype(dtype)
    dh = jnp.dot(dz, k.T).astype(h.dtype)
    dk = jnp.dot(hc.astype(dtype).T, dz, preferred_element_type=jnp.float32)
    db = jnp.sum(dz, axis=0, dtype=jnp.float32)
    return dh, dk, db

  if chunk >= h.shape[0]:
    dh, dk, db = grads(h, targets, lse, g, z)
  else:

    def step(carry, xs):
      hc, tc, lc, gc, zc = xs
      dh, dk, db = grads(hc, tc, lc, gc, zc)
      return (carry[0] + dk, carry[1] + db), dh

    xs = (
      _split(h, chunk),
      _split(targets, chunk),
      _split(lse, chunk),
      _split(g, chunk),
      None if z is None else z,
    )
    init = (jnp.zeros(kernel.shape, jnp.float32), jnp.zeros((kernel.shape[1],), jnp.float32))
    (dk, db), dh = jax.lax.scan(step, init, xs)
    dh = dh.reshape(h.shape)
  dk = dk.astype(kernel.dtype)
  db = None if bias is None else db.astype(bias.dtype)
  return dh, None, dk, db


_nll_rows.defvjp(_nll_fwd, _nll_bwd)


def fused_nll(
  hidden: jax.Array,
  targets: jax.Array,
  kernel: jax.Array,
  bias: Optional[jax.Array] = None,
  *,
  dtype=jnp.float32,
  suppress_id: Optional[int] = None,
  chunk_rows: Optional[int] = None,
  recompute: bool = False,
  vocab_chunk: Optional[int] = None,
) -> jax.Array:
  """Per-token NLL of the output head, -log softmax(h W + b)[target], without [N, V] log-probs.

  Args:
    hidden: [..., D] final hidden states (what enters the head); targets: int [...].
    kernel: [D, V] head kernel; bias: [V] or None. dtype: the matmul compute dtype.
    suppress_id: a token whose logit is -1e12 (the mask token, SPEC §3.5), or None.
    chunk_rows: rows per chunk (None: all rows at once); rows are padded to a multiple.
    recompute: recompute the logits in the backward pass instead of keeping them.
    vocab_chunk: columns per vocabulary chunk (None/0: off). When V > vocab_chunk the head runs
      chunk by chunk over the vocabulary: an online logsumexp forward, and a backward that
      recomputes each chunk's logits (one more h W matmul) and takes that kernel chunk's gradient
      over all rows at once. No [N, V] array exists at any point; on a CPU this is also the
      faster path (the [N, V] logits never leave the cache). Excludes chunk_rows / recompute.
  Returns:
    fp32 [...] NLL; differentiable in hidden, kernel and bias.
  """
  if hidden.shape[:-1] != targets.shape:
    raise ValueError(f"fused_nll: hidden {hidden.shape} does not match targets {targets.shape}")
  if vocab_chunk and (chunk_rows or recompute):
    raise ValueError(
      "fused_nll: vocab_chunk excludes chunk_rows and recompute (it never keeps "
      "[N, V] logits); pass vocab_chunk=0 to use them"
    )
  lead = targets.shape
  h = hidden.reshape(-1, hidden.shape[-1])
  t = targets.reshape(-1).astype(jnp.int32)
  if vocab_chunk and kernel.shape[1] > int(vocab_chunk):
    nll = _nll_vocab(h, t, kernel, bias, jnp.dtype(dtype), suppress_id, int(vocab_chunk))
    return nll.reshape(lead)
  n = h.shape[0]
  chunk = n if not chunk_rows else min(int(chunk_rows), n)
  pad = -n % chunk
  if pad:
    h = jnp.pad(h, ((0, pad), (0, 0)))
    t = jnp.pad(t, (0, pad))
  nll = _nll_rows(h, t, kernel, bias, jnp.dtype(dtype), suppress_id, chunk, bool(recompute))
  return nll[:n].reshape(lead)


def _vocab_chunks(kernel, bias, chunk: int):
  """kernel [D, V] -> [n, D, chunk]; bias [V] -> [n, chunk] (zeros without a bias); V padded."""
  d, v = kernel.shape
  n = -(-v // chunk)
  pad = n * chunk - v
  kc = jnp.pad(kernel, ((0, 0), (0, pad))).reshape(d, n, chunk).transpose(1, 0, 2)
  b = jnp.zeros((v,), kernel.dtype) if bias is None else bias
  return kc, jnp.pad(b, (0, pad)).reshape(n, chunk)


def _chunk_logits(h, i, kc, bc, dtype, vocab: int, suppress_id):
  """fp32 logits [n, chunk] of vocabulary chunk i, with padding and the suppressed id at -1e12,
  and the global column index of each entry."""
  z = head_logits(h, kc, bc, dtype)
  col = jax.lax.broadcasted_iota(jnp.int32, z.shape, 1) + i * kc.shape[-1]
  dead = col >= vocab
  if suppress_id is not None:
    dead = dead | (col == suppress_id)
  return jnp.where(dead, NEG_INF_LOGIT, z), col, dead


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _nll_vocab(h, targets, kernel, bias, dtype, suppress_id, chunk):
  return _nll_vocab_fwd(h, targets, kernel, bias, dtype, suppress_id, chunk)[0]


def _nll_vocab_fwd(h, targets, kernel, bias, dtype, suppress_id, chunk):
  """Online logsumexp over vocabulary chunks: no [N, V] array, forward or residual."""
  vocab = kernel.shape[1]
  kc, bc = _vocab_chunks(kernel, bias, chunk)

  def step(carry, xs):
    mx, total, zt = carry
    i, k, b = xs
    z, col, _ = _chunk_logits(h, i, k, b, dtype, vocab, suppress_id)
    new_mx = jnp.maximum(mx, jnp.max(z, axis=-1))
    total = total * jnp.exp(mx - new_mx) + jnp.sum(jnp.exp(z - new_mx[:, None]), axis=-1)
    zt = zt + jnp.sum(jnp.where(col == targets[:, None], z, 0.0), axis=-1)
    return (new_mx, total, zt), None

  n = h.shape[0]
  init = (
    jnp.full((n,), -jnp.inf, jnp.float32),
    jnp.zeros((n,), jnp.float32),
    jnp.zeros((n,), jnp.float32),
  )
  (mx, total, zt), _ = jax.lax.scan(step, init, (jnp.arange(kc.shape[0]), kc, bc))
  lse = mx + jnp.log(total)
  return lse - zt, (h, targets, kernel, bias, lse)


def _nll_vocab_bwd(dtype, suppress_id, chunk, res, g):
  """Per chunk: recompute the logits, dz = g (softmax - onehot), dh += dz W_c^T, dW_c = h^T dz
  (each kernel chunk's gradient in one matmul over all rows)."""
  h, targets, kernel, bias, lse = res
  vocab = kernel.shape[1]
  kc, bc = _vocab_chunks(kernel, bias, chunk)
  hd = h.astype(dtype)

  def step(dh, xs):
    i, k, b = xs
    z, col, dead = _chunk_logits(h, i, k, b, dtype, vocab, suppress_id)
    dz = jnp.exp(z - lse[:, None]) - (col == targets[:, None]).astype(jnp.float32)
    dz = (jnp.where(dead, 0.0, dz) * g[:, None]).astype(dtype)
    dh = dh + jnp.dot(dz, k.astype(dtype).T, preferred_element_type=jnp.float32)
    dk = jnp.dot(hd.T, dz, preferred_element_type=jnp.float32)
    return dh, (dk, jnp.sum(dz, axis=0, dtype=jnp.float32))

  dh, (dk, db) = jax.lax.scan(
    step, jnp.zeros(h.shape, jnp.float32), (jnp.arange(kc.shape[0]), kc, bc)
  )
  dk = dk.transpose(1, 0, 2).reshape(kernel.shape[0], -1)[:, :vocab].astype(kernel.dtype)
  db = None if bias is None else db.reshape(-1)[:vocab].astype(bias.dtype)
  return dh.astype(h.dtype), None, dk, db


_nll_vocab.defvjp(_nll_vocab_fwd, _nll_vocab_bwd)


def reference_nll(
  logits: jax.Array, targets: jax.Array, suppress_id: Optional[int] = None
) -> jax.Array:
  """The unfused path from logits: -log_softmax(suppress(logits))[target], fp32 [...]."""
  logits = logits.astype(jnp.float32)
  if suppress_id is not None:
    logits = suppress_mask_logit(logits, suppress_id)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def check_head_fields(cfg):
  """Config validation shared by the backbones: the head's chunking fields do not conflict."""
  if cfg.head_vocab_chunk < 0:
    raise ValueError(f"head_vocab_chunk={cfg.head_vocab_chunk} must be >= 0 (0 = off)")
  if cfg.head_vocab_chunk and (cfg.head_chunk_rows or cfg.head_recompute):
    raise ValueError(
      "head_chunk_rows / head_recompute apply to the head without vocabulary "
      f"chunks; set head_vocab_chunk=0 to use them (it is {cfg.head_vocab_chunk})"
    )


def supports_fused(model) -> bool:
  """The backbone can hand over hidden states + head weights and its config asks for it."""
  cfg = getattr(model, "config", None)
  return bool(getattr(cfg, "fused_head", False)) and hasattr(model, "output_head")


def token_nll(
  forward: Callable[..., jax.Array],
  model,
  params,
  targets: jax.Array,
  *,
  suppress_id: Optional[int] = None,
) -> jax.Array:
  """NLL [B, S'] of `targets` under the backbone output of `forward(**extra)`.

  `forward` runs the backbone (all arguments bound but the extra keyword `return_hidden`); the
  fused head is used when `supports_fused(model)`, else the logits path (`reference_nll`).
  """
  if not supports_fused(model):
    return reference_nll(forward(), targets, suppress_id)
  cfg = model.config
  kernel, bias = model.output_head(params)
  return fused_nll(
    forward(return_hidden=True),
    targets,
    kernel,
    bias,
    dtype=jnp.dtype(getattr(cfg, "dtype", "float32")),
    suppress_id=suppress_id,
    chunk_rows=getattr(cfg, "head_chunk_rows", None) or None,
    recompute=bool(getattr(cfg, "head_recompute", False)),
    vocab_chunk=getattr(cfg, "head_vocab_chunk", 0) or None,
  )


__all__ = [
  "fused_nll",
  "reference_nll",
  "head_logits",
  "supports_fused",
  "token_nll",
  "check_head_fields",
]
