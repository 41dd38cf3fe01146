"""Conformance tests for setdiff_jax.models.dit (SPEC §3): parameter tree, init, rotary, a NumPy
re-implementation of the forward pass, KV cache, dtypes and dropout."""

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax.diffusion import masks
from setdiff_jax.models import init_params, param_shapes
from setdiff_jax.models.dit import DiT, DiTConfig, LayerNormNoBias, count_params
from setdiff_jax.models.layers import (
  NEG_INF_LOGIT,
  apply_rotary,
  rotary_cos_sin,
  suppress_mask_logit,
)


pytestmark = pytest.mark.usefixtures("fast_compile")

TINY = DiTConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, cond_dim=16, dropout=0.0)


def flat(tree):
  return {
    "/".join(str(getattr(k, "key", k)) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg, static):
  return jax.jit(
    lambda p, args, kw, rngs: DiT(cfg).apply({"params": p}, *args, rngs=rngs, **kw, **dict(static))
  )


def apply(cfg, params, *args, rngs=None, **kwargs):
  """DiT(cfg).apply under jit; Python bool/int keyword arguments are static."""
  static = tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, (bool, int))))
  dynamic = {k: v for k, v in kwargs.items() if not isinstance(v, (bool, int))}
  return _jitted_apply(cfg, static)(params, tuple(jnp.asarray(a) for a in args), dynamic, rngs)


# ------------------------------------------------------------------------------------ NumPy DiT
def np_layernorm(x, scale):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-5) * scale


def np_rotary(x, pos, base=10000.0):
  """Half-split rotary on x [B, S, H, Dh] at positions [B, S]; the table in fp32 as the reference."""
  dh = x.shape[-1]
  inv = (base ** (-np.arange(0, dh, 2) / dh)).astype(np.float32)  # correctly rounded fp32
  theta = (pos.astype(np.float32)[..., None] * inv).astype(np.float64)
  c, s = np.cos(theta)[:, :, None, :], np.sin(theta)[:, :, None, :]
  x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
  return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def np_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def np_silu(x):
  return x / (1 + np.exp(-x))


def np_dit(p, cfg, tokens, positions, mask, sigma=None, cache=None):
  """Reference forward in float64 (SPEC §3.2-3.4). mask bool [B, S, C+S]; cache per layer (k, v)."""
  p = {k: np.asarray(v, np.float64) for k, v in flat(p).items()}
  tokens, positions, mask = np.asarray(tokens), np.asarray(positions), np.asarray(mask, bool)
  bsz, s = tokens.shape
  d, h, dh = cfg.hidden_size, cfg.num_heads, cfg.head_dim
  x = p["embed/embedding"][tokens]
  lin = lambda name, a: a @ p[f"{name}/kernel"] + p.get(f"{name}/bias", 0.0)
  if cfg.adaln:
    sig = np.zeros(bsz) if sigma is None else np.asarray(sigma, np.float64)
    freqs = np.exp(-math.log(10000.0) * np.arange(128) / 128)
    temb = np.concatenate([np.cos(sig[:, None] * freqs), np.sin(sig[:, None] * freqs)], -1)
    cond = np_silu(lin("sigma_map/dense1", np_silu(lin("sigma_map/dense0", temb))))
  kvs = []
  for i in range(cfg.num_layers):
    pre = f"blocks_{i}"
    if cfg.adaln:
      mods = np.split(lin(f"{pre}/adaln", cond)[:, None, :], 6, -1)
    a = np_layernorm(x, p[f"{pre}/norm1/scale"])
    if cfg.adaln:
      a = a * (1 + mods[1]) + mods[0]
    qkv = lin(f"{pre}/attn_qkv", a).reshape(bsz, s, 3, h, dh)
    q, k, v = np_rotary(qkv[:, :, 0], positions), np_rotary(qkv[:, :, 1], positions), qkv[:, :, 2]
    kvs.append((k, v))
    if cache is not None:
      k = np.concatenate([cache[i][0], k], 1)
      v = np.concatenate([cache[i][1], v], 1)
    sc = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
    sc = np.where(mask[:, None], sc, -np.inf)
    empty = ~mask.any(-1)[:, None, :, None]  # a fully masked row: uniform over keys
    sc = np.where(empty, 0.0, sc)
    w = np.exp(sc - sc.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(bsz, s, d)
    o = lin(f"{pre}/attn_out", o)
    x = x + (mods[2] * o if cfg.adaln else o)
    a = np_layernorm(x, p[f"{pre}/norm2/scale"])
    if cfg.adaln:
      a = a * (1 + mods[4]) + mods[3]
    m = lin(f"{pre}/mlp_out", np_gelu_tanh(lin(f"{pre}/mlp_in", a)))
    x = x + (mods[5] * m if cfg.adaln else m)
  x = np_layernorm(x, p["final_norm/scale"])
  if cfg.adaln:
    shift, scale = np.split(lin("final_adaln", cond)[:, None, :], 2, -1)
    x = x * (1 + scale) + shift
  return lin("head", x), kvs


def random_inputs(seed, bsz, s, vocab):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (bsz, s))
  positions = np.stack([rng.permutation(s) for _ in range(bsz)])
  return tokens, positions


# ------------------------------------------------------------------------------------ params
def test_lm1b_and_owt_param_count():
  # Independent count from the SPEC §3.9 shapes.
  def count(v, d=768, layers=12):
    per_layer = d + 3 * d * d + d * d + d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return v * d + layers * per_layer + d + d * v + v

  assert count(30522) == 131_912_250 and count(50258) == 162_246_482
  lm1b = param_shapes(DiTConfig())
  assert count_params(lm1b) == 131_912_250
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(lm1b))
  assert count_params(param_shapes(DiTConfig(vocab_size=50258))) == 162_246_482


@pytest.mark.parametrize("adaln", [False, True])
def test_param_tree_names_and_shapes(adaln):
  d, v, c = 32, 48, 16
  cfg = DiTConfig(vocab_size=v, hidden_size=d, num_layers=2, num_heads=4, cond_dim=c, adaln=adaln)
  expected = {
    "embed/embedding": (v, d),
    "final_norm/scale": (d,),
    "head/kernel": (d, v),
    "head/bias": (v,),
  }
  for i in range(2):
    expected.update(
      {
        f"blocks_{i}/norm1/scale": (d,),
        f"blocks_{i}/attn_qkv/kernel": (d, 3 * d),
        f"blocks_{i}/attn_out/kernel": (d, d),
        f"blocks_{i}/norm2/scale": (d,),
        f"blocks_{i}/mlp_in/kernel": (d, 4 * d),
        f"blocks_{i}/mlp_in/bias": (4 * d,),
        f"blocks_{i}/mlp_out/kernel": (4 * d, d),
        f"blocks_{i}/mlp_out/bias": (d,),
      }
    )
    if adaln:
      expected.update({f"blocks_{i}/adaln/kernel": (c, 6 * d), f"blocks_{i}/adaln/bias": (6 * d,)})
  if adaln:
    expected.update(
      {
        "sigma_map/dense0/kernel": (256, c),
        "sigma_map/dense0/bias": (c,),
        "sigma_map/dense1/kernel": (c, c),
        "sigma_map/dense1/bias": (c,),
        "final_adaln/kernel": (c, 2 * d),
        "final_adaln/bias": (2 * d,),
      }
    )
  got = {k: tuple(x.shape) for k, x in flat(param_shapes(cfg)).items()}
  assert got == expected


def test_initialisation():
  d, v = 64, 64
  cfg = DiTConfig(vocab_size=v, hidden_size=d, num_layers=1, num_heads=4, cond_dim=16, adaln=True)
  params = jax.jit(lambda k: init_params(cfg, k))(jax.random.key(0))
  p = {k: np.asarray(x) for k, x in flat(params).items()}
  np.testing.assert_array_equal(p["head/kernel"], 0.0)
  np.testing.assert_array_equal(p["head/bias"], 0.0)
  for name in ("blocks_0/adaln", "final_adaln"):  # adaLN linears zero-initialised
    np.testing.assert_array_equal(p[f"{name}/kernel"], 0.0)
    np.testing.assert_array_equal(p[f"{name}/bias"], 0.0)
  for name in ("blocks_0/norm1/scale", "blocks_0/norm2/scale", "final_norm/scale"):
    np.testing.assert_array_equal(p[name], 1.0)

  def check_uniform(x, bound):
    assert np.abs(x).max() <= bound
    assert np.abs(x).max() > 0.9 * bound
    assert abs(x.mean()) < 0.1 * bound
    assert x.var() == pytest.approx(bound**2 / 3, rel=0.15)

  check_uniform(p["embed/embedding"], 1 / math.sqrt(d))  # SPEC §3.6: 1/sqrt(D), not N(0, 1)
  check_uniform(p["blocks_0/attn_qkv/kernel"], 1 / math.sqrt(d))
  check_uniform(p["blocks_0/attn_out/kernel"], 1 / math.sqrt(d))
  check_uniform(p["blocks_0/mlp_in/kernel"], 1 / math.sqrt(d))
  check_uniform(p["blocks_0/mlp_out/kernel"], 1 / math.sqrt(4 * d))
  check_uniform(p["blocks_0/mlp_in/bias"], 1 / math.sqrt(d))
  check_uniform(p["sigma_map/dense0/kernel"], 1 / math.sqrt(256))
  assert np.abs(p["blocks_0/mlp_out/bias"]).max() <= 1 / math.sqrt(4 * d)
  assert np.abs(p["sigma_map/dense1/bias"]).max() <= 1 / math.sqrt(16)
  # Zero head: logits are exactly zero at init.
  logits = apply(
    cfg, params, np.zeros((1, 4), np.int32), np.arange(4)[None], np.ones((1, 4, 4), bool)
  )
  np.testing.assert_array_equal(logits, 0.0)


# ------------------------------------------------------------------------------------ rotary
def test_rotary_matches_numpy_half_split():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 3, 64)).astype(np.float32)
  pos = np.array([[0, 1, 7, 300, 1023], [4, 3, 2, 1, 0]])
  cos, sin = rotary_cos_sin(jnp.asarray(pos), 64)
  out = apply_rotary(jnp.asarray(x), cos, sin)
  # atol: fp32 cos/sin of angles up to ~240 rad are good to a few 1e-5
  np.testing.assert_allclose(out, np_rotary(x.astype(np.float64), pos), atol=1e-4)
  # At the end of the reference table (16383) an fp32 angle is only good to ~1e-3 rad.
  far = np.array([[16383, 12345]])
  cf, sf = rotary_cos_sin(jnp.asarray(far), 64)
  np.testing.assert_allclose(
    apply_rotary(jnp.asarray(x[:1, :2]), cf, sf),
    np_rotary(x[:1, :2].astype(np.float64), far),
    atol=1e-2,
  )
  # inv_freq_j = 10000^(-2j/64): position 1 gives cos(inv_freq) on both halves.
  inv = 10000.0 ** (-np.arange(32) * 2 / 64)
  np.testing.assert_allclose(cos[0, 1], np.concatenate([np.cos(inv), np.cos(inv)]), atol=1e-6)
  np.testing.assert_allclose(sin[0, 1], np.concatenate([np.sin(inv), np.sin(inv)]), atol=1e-6)
  # Not the interleaved convention: rotating e_0 by position 1 moves mass to index 32, not 1.
  e0 = np.zeros((1, 1, 1, 64), np.float32)
  e0[..., 0] = 1
  r = np.asarray(apply_rotary(jnp.asarray(e0), cos[:1, 1:2], sin[:1, 1:2]))[0, 0, 0]
  assert r[32] == pytest.approx(np.sin(1.0), abs=1e-6) and r[1] == 0


def _count_ops(compiled_text: str, op: str) -> int:
  return len(re.findall(r"= \S+ " + op + r"\(", compiled_text))


@pytest.mark.usefixtures("full_optimizations")
def test_rotary_table_computed_once_in_the_optimised_step():
  """The forward + backward of a 2-layer DiT evaluates cos and sin once, not inside each rotary
  product (4 per layer: q and k, forward and backward), where XLA would recompute them for every
  element of [B, S, H, Dh]. A structural check of the compiled program, not a timing."""
  params = random_params(TINY)
  tokens = jnp.zeros((2, 8), jnp.int32)
  positions = jnp.asarray(np.random.default_rng(0).permutation(16).reshape(2, 8))
  mask = jnp.ones((2, 8, 8), bool)
  loss = lambda p: DiT(TINY).apply({"params": p}, tokens, positions, mask).sum()
  text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  assert _count_ops(text, "cosine") == 1 and _count_ops(text, "sine") == 1
  # and the values are the plain table's
  cos, sin = rotary_cos_sin(positions, TINY.head_dim)
  theta = np.asarray(positions, np.float32)[..., None] * (
    1.0 / (10000.0 ** (np.arange(0, TINY.head_dim, 2, dtype=np.float32) / TINY.head_dim))
  )
  theta = np.concatenate([theta, theta], -1)
  np.testing.assert_allclose(cos, np.cos(theta), atol=1e-6)
  np.testing.assert_allclose(sin, np.sin(theta), atol=1e-6)


# ------------------------------------------------------------------------------------ forward
@pytest.mark.parametrize("adaln", [False, True])
def test_forward_matches_numpy(adaln):
  cfg = dataclasses.replace(TINY, adaln=adaln)
  params = random_params(cfg)
  length = 5
  tokens, positions = random_inputs(1, 2, 2 * length, cfg.vocab_size)
  mask = np.broadcast_to(masks.set_causal_mask(length), (2, 2 * length, 2 * length)).copy()
  mask[1] &= np.concatenate([[1, 1, 1, 0, 0]] * 2).astype(bool)[None, :]  # padded keys, row 1
  sigma = np.array([0.0, 0.3]) if adaln else None
  kwargs = {"sigma": jnp.asarray(sigma)} if adaln else {}
  got = apply(cfg, params, tokens, positions, mask, **kwargs)
  ref, _ = np_dit(params, cfg, tokens, positions, mask, sigma)
  assert np.abs(ref).max() > 0.1
  np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-4)
  # head_start: only rows [head_start:] go through the head, same values.
  got_tail = apply(cfg, params, tokens, positions, mask, head_start=length, **kwargs)
  np.testing.assert_allclose(got_tail, np.asarray(got)[:, length:], atol=1e-6)
  if adaln:  # sigma defaults to zero
    got0 = apply(cfg, params, tokens, positions, mask)
    ref0, _ = np_dit(params, cfg, tokens, positions, mask, np.zeros(2))
    np.testing.assert_allclose(got0, ref0, atol=2e-5, rtol=1e-4)


def test_suppress_mask_logit():
  z = jnp.arange(12.0).reshape(1, 2, 6)
  out = np.asarray(suppress_mask_logit(z, 4))
  np.testing.assert_array_equal(out[..., 4], np.float32(-1e12))
  np.testing.assert_array_equal(np.delete(out, 4, -1), np.delete(np.asarray(z), 4, -1))


def test_torch_reference_mask_logit_is_the_models():
  """The torch reference (which must not import jax) keeps its own copy of the constant."""
  torch_reference = pytest.importorskip("setdiff_jax.testing.torch_reference")
  assert torch_reference.NEG_INF_LOGIT == NEG_INF_LOGIT == -1e12


def test_kv_cache_equals_uncached():
  """One cached decoding step == the uncached forward on [committed ; step inputs] (SPEC §2.8)."""
  cfg = TINY
  params = random_params(cfg)
  # committed tokens (commit order) with their positions; step = 2 pending + 3 active masks
  c, pn, a = 5, 2, 3
  tokens, _ = random_inputs(2, 1, c + pn + a, cfg.vocab_size)
  tokens[0, c + pn :] = 1  # the mask token
  positions = np.array([[0, 1, 2, 6, 3, 4, 9, 5, 7, 8]])
  step_mask = np.asarray(
    masks.cached_step_mask(np.ones((1, c), bool), np.ones((1, pn), bool), np.ones((1, a), bool))
  )
  full_mask = np.zeros((1, c + pn + a, c + pn + a), bool)
  full_mask[0, :c, :c] = np.tril(np.ones((c, c), bool))
  full_mask[:, c:] = step_mask
  uncached = apply(cfg, params, tokens, positions, full_mask)
  ref, _ = np_dit(params, cfg, tokens, positions, full_mask)
  np.testing.assert_allclose(uncached, ref, atol=2e-5, rtol=1e-4)

  _, kv = apply(cfg, params, tokens[:, :c], positions[:, :c], full_mask[:, :c, :c], return_kv=True)
  assert len(kv) == cfg.num_layers and kv[0][0].shape == (1, c, cfg.num_heads, cfg.head_dim)
  cached = apply(cfg, params, tokens[:, c:], positions[:, c:], step_mask, kv_cache=kv)
  np.testing.assert_allclose(cached, np.asarray(uncached)[:, c:], atol=1e-5)
  # Keys in the cache are after RoPE: the NumPy reference's post-rotary keys.
  _, ref_kv = np_dit(params, cfg, tokens[:, :c], positions[:, :c], full_mask[:, :c, :c])
  np.testing.assert_allclose(kv[1][0], ref_kv[1][0], atol=2e-5)
  np.testing.assert_allclose(kv[1][1], ref_kv[1][1], atol=2e-5)

  # A fixed-capacity cache with garbage in invalid slots gives the same logits.
  cap = 8
  garbage = tuple(
    tuple(jnp.concatenate([x, 100.0 * jnp.ones((1, cap - c) + x.shape[2:])], 1) for x in layer)
    for layer in kv
  )
  valid = np.zeros((1, cap), bool)
  valid[0, :c] = True
  cap_mask = masks.cached_step_mask(valid, np.ones((1, pn), bool), np.ones((1, a), bool))
  cached_cap = apply(cfg, params, tokens[:, c:], positions[:, c:], cap_mask, kv_cache=garbage)
  np.testing.assert_allclose(cached_cap, cached, atol=1e-5)


# ------------------------------------------------------------------------------------ dtypes
def test_bfloat16_compute():
  cfg32 = TINY
  cfg16 = dataclasses.replace(TINY, dtype="bfloat16")
  shapes = param_shapes(cfg16)
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(shapes))
  params = random_params(cfg32)
  length = 6
  tokens, positions = random_inputs(3, 2, 2 * length, TINY.vocab_size)
  mask = jnp.asarray(masks.set_causal_mask(length))[None]
  args = (jnp.asarray(tokens), jnp.asarray(positions), mask)
  z32 = apply(cfg32, params, *args)

  @jax.jit
  def run16(p):
    z, state = DiT(cfg16).apply(
      {"params": p}, *args, capture_intermediates=True, mutable=["intermediates"]
    )
    return z, state["intermediates"]

  z16, inter = run16(params)
  assert z16.dtype == jnp.float32
  err = np.abs(np.asarray(z16) - np.asarray(z32)).max()
  assert 0 < err < 0.02 * np.abs(np.asarray(z32)).max(), err
  # residual stream stays fp32, the attention K/V run in bf16, LayerNorm returns its input dtype
  h, (k, v) = inter["blocks_0"]["__call__"][0]
  assert h.dtype == jnp.float32 and k.dtype == jnp.bfloat16 and v.dtype == jnp.bfloat16
  assert inter["blocks_0"]["norm1"]["__call__"][0].dtype == jnp.float32
  assert inter["blocks_0"]["attn_qkv"]["__call__"][0].dtype == jnp.bfloat16


def test_layernorm_in_fp32():
  rng = np.random.default_rng(0)
  # Large common offset: bf16 arithmetic would round the mean to a multiple of 4.
  x = (1000.0 + rng.normal(size=(4, 64)) * 3).astype(jnp.bfloat16)
  scale = (1 + 0.1 * rng.normal(size=64)).astype(np.float32)
  ln = LayerNormNoBias()
  y = ln.apply({"params": {"scale": jnp.asarray(scale)}}, jnp.asarray(x))
  assert y.dtype == jnp.bfloat16
  ref = np_layernorm(np.asarray(x, np.float64), scale.astype(np.float64))
  np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2**-7, atol=2**-7)
  # The tolerance is discriminating: the same LayerNorm computed in bf16 misses it by far.
  xb = jnp.asarray(x)
  mu = jnp.mean(xb, -1, keepdims=True).astype(jnp.bfloat16)
  var = jnp.mean(jnp.square(xb - mu), -1, keepdims=True).astype(jnp.bfloat16)
  naive = (xb - mu) * jax.lax.rsqrt(var + jnp.bfloat16(1e-5)) * scale.astype(jnp.bfloat16)
  assert np.abs(np.asarray(naive, np.float64) - ref).max() > 10 * 2**-7


def test_dropout_only_when_not_deterministic():
  cfg_d = dataclasses.replace(TINY, dropout=0.5)
  params = random_params(TINY)
  tokens, positions = random_inputs(1, 2, 10, TINY.vocab_size)  # shapes of test_forward_matches
  args = (tokens, positions, np.ones((2, 10, 10), bool))
  base = apply(TINY, params, *args)
  det = apply(cfg_d, params, *args, deterministic=True, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_array_equal(det, base)
  drop_a = apply(cfg_d, params, *args, deterministic=False, rngs={"dropout": jax.random.key(0)})
  drop_b = apply(cfg_d, params, *args, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert np.abs(np.asarray(drop_a) - np.asarray(base)).max() > 1e-3
  assert np.abs(np.asarray(drop_a) - np.asarray(drop_b)).max() > 1e-3
  # p = 0: the stochastic path is the deterministic one (no other randomness)
  nodrop = apply(TINY, params, *args, deterministic=False, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_array_equal(nodrop, base)
  with pytest.raises(Exception):
    apply(cfg_d, params, *args, deterministic=False)  # needs a dropout rng
