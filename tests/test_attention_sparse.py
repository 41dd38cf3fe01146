"""Tiled attention paths (`blocksparse`, `splash`) against the dense reference (attention.py).

Static masks are the two-stream set-causal and block masks with padding, as the objectives build
them; outputs and gradients must match dense, including fully masked (padded) query rows.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax import objectives
from setdiff_jax.models import attention
from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion import losses
from setdiff_jax.models.dit import DiT, DiTConfig

pytestmark = pytest.mark.usefixtures("fast_compile")


def _qkv(seed, b, s, h=2, d=8):
  ks = jax.random.split(jax.random.key(seed), 3)
  return [jax.random.normal(k, (b, s, h, d), jnp.float32) for k in ks]


def _two_stream(static, length, valid):
  return jnp.asarray(static)[None] & masks.two_stream_padding(jnp.asarray(valid))


@pytest.mark.parametrize("which", ["set", "block"])
def test_blocksparse_equals_dense(which):
  length = 16
  static = masks.set_causal_mask(length) if which == "set" else masks.block_causal_mask(length, 4)
  valid = np.ones((2, length), bool)
  valid[1, 11:] = False  # padded rows: fully masked queries in the noisy stream
  dense_mask = _two_stream(static, length, valid)
  tiled = attention.with_tiles(dense_mask, static, "blocksparse")
  q, k, v = _qkv(0, 2, 2 * length)
  assert attention.StaticPattern(static).tiles(8).mean() < 1.0  # something is skipped
  want = attention.dense_attention(q, k, v, dense_mask)
  got = jax.jit(lambda q, k, v, m: attention.blocksparse_attention(q, k, v, m, tile=8))(
    q, k, v, tiled
  )
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  w = jax.random.normal(jax.random.key(9), want.shape)
  loss = lambda f: lambda q, k, v: jnp.sum(w * f(q, k, v))
  g_d = jax.jit(
    jax.grad(loss(lambda q, k, v: attention.dense_attention(q, k, v, dense_mask)), (0, 1, 2))
  )(q, k, v)
  g_s = jax.jit(
    jax.grad(
      loss(lambda q, k, v: attention.blocksparse_attention(q, k, v, tiled, tile=8)), (0, 1, 2)
    )
  )(q, k, v)
  for a, b in zip(g_s, g_d):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tiled_mask_falls_back_for_plain_masks_and_other_impls():
  q, k, v = _qkv(1, 1, 8)
  m = jnp.asarray(masks.causal_mask(8))[None]
  want = attention.dense_attention(q, k, v, m)
  assert attention.with_tiles(m, masks.causal_mask(8), "dense") is m
  for impl in ("blocksparse", "splash"):
    np.testing.assert_allclose(attention.attend(q, k, v, m, impl), want, rtol=1e-6, atol=1e-6)
  tiled = attention.with_tiles(m, masks.causal_mask(8), "splash")
  np.testing.assert_allclose(attention.attend(q, k, v, tiled, "dense"), want, rtol=1e-6, atol=1e-6)


def test_splash_interpret_equals_dense_on_valid_rows():
  """The Pallas kernel in interpret mode (CPU): same outputs on every valid query."""
  length = 64
  static = masks.set_causal_mask(length)
  valid = np.ones((2, length), bool)
  valid[0, 50:] = False
  dense_mask = _two_stream(static, length, valid)
  q, k, v = _qkv(2, 2, 2 * length, h=2, d=64)
  want = np.asarray(attention.dense_attention(q, k, v, dense_mask))
  got = np.asarray(
    attention.splash_attention(
      q, k, v, attention.with_tiles(dense_mask, static, "splash"), interpret=True
    )
  )
  rows = np.concatenate([valid, valid], -1)  # [B, 2L] valid queries
  np.testing.assert_allclose(got[rows], want[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,adaln", [("setdlm", False), ("bd3lm", True)])
def test_objective_blocksparse_equals_dense(name, adaln):
  """Loss and gradients of a training step are the same with `attention=blocksparse`."""
  cfg = DiTConfig(
    vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, cond_dim=16, dropout=0.0, adaln=adaln
  )
  obj = losses.ObjectiveConfig(name=name, mask_token_id=3, desired_set_size=2, block_size=4)
  rng = np.random.default_rng(0)
  tokens = rng.integers(4, 32, (2, 32)).astype(np.int32)
  real = np.ones_like(tokens)
  real[1, 20:] = 0
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(real)}
  params = random_params(cfg)
  out = {}
  for impl in ("dense", "blocksparse"):
    c = dataclasses.replace(cfg, attention=impl)
    fn = jax.jit(
      jax.value_and_grad(
        lambda p: objectives.compute_loss(obj, DiT(c), p, batch, jax.random.key(4), train=True)[0]
      )
    )
    out[impl] = fn(params)
  np.testing.assert_allclose(out["blocksparse"][0], out["dense"][0], rtol=1e-6)
  for a, b in zip(
    jax.tree_util.tree_leaves(out["blocksparse"][1]), jax.tree_util.tree_leaves(out["dense"][1])
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["blocksparse", pytest.param("splash", marks=pytest.mark.slow)])
def test_tiled_attention_under_shard_map_equals_dense(impl):
  """On 8 emulated devices (data=2 x tensor=4 context mesh), the tiled paths run per shard under
  shard_map (splash: the kernel in interpret mode) and give dense attention on every valid row."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  from setdiff_jax import sharding

  length = 64
  static = masks.set_causal_mask(length)
  valid = np.ones((2, length), bool)
  valid[0, 50:] = False
  dense_mask = _two_stream(static, length, valid)
  q, k, v = _qkv(4, 2, 2 * length, h=4, d=64 if impl == "splash" else 8)
  want = np.asarray(attention.dense_attention(q, k, v, dense_mask))
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  split = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))
  q, k, v = (jax.device_put(x, split) for x in (q, k, v))
  tiled = attention.with_tiles(dense_mask, static, impl)
  if impl == "splash":
    fn = lambda q, k, v, m: attention.per_shard(
      lambda *a: attention.splash_attention(*a, interpret=True), q, k, v, m
    )
  else:
    fn = lambda q, k, v, m: attention.attend(q, k, v, m, impl)
  with jax.set_mesh(mesh):
    lowered = jax.jit(fn).lower(q, k, v, tiled)
    got = np.asarray(jax.jit(fn)(q, k, v, tiled))
  assert "shard_map" in lowered.as_text() or "sdy.manual_computation" in lowered.as_text()
  rows = np.concatenate([valid, valid], -1)
  np.testing.assert_allclose(got[rows], want[rows], rtol=1e-5, atol=1e-5)
