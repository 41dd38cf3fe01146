"""The head-major KV cache (kv_layout="bhsd", the samplers' layout): `attention.attend_cached`
against attention over the concatenated keys, the DiT / Qwen3 cached step in both layouts, and
`append` / `empty_cache` on the slot axis 2 against a NumPy write."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax import models
from setdiff_jax.models import attention
from setdiff_jax.diffusion import masks
from setdiff_jax.models.dit import DiT, DiTConfig
from setdiff_jax.models.qwen3 import Qwen3, Qwen3Config
from setdiff_jax.sampling import cache as cache_lib

pytestmark = pytest.mark.usefixtures("fast_compile")


def _qkv(rng, b, s, c, h, kh, dh=8):
  q = rng.standard_normal((b, s, h, dh)).astype(np.float32)
  k, v = (rng.standard_normal((b, s, kh, dh)).astype(np.float32) for _ in range(2))
  pk, pv = (rng.standard_normal((b, c, kh, dh)).astype(np.float32) for _ in range(2))
  mask = rng.random((b, s, c + s)) < 0.6
  mask[:, :, 0] = True
  mask[0, 0] = False  # a fully masked query row: the uniform average over all keys
  return q, k, v, pk, pv, mask


def _reference(q, k, v, pk, pv, mask):
  """Dense attention over [cache | new] keys, KV heads repeated (HF `repeat_kv`)."""
  keys, vals = np.concatenate([pk, k], 1), np.concatenate([pv, v], 1)
  rep = q.shape[2] // k.shape[2]
  keys, vals = np.repeat(keys, rep, 2), np.repeat(vals, rep, 2)
  return np.asarray(attention.dense_attention(q, keys, vals, mask))


@pytest.mark.parametrize(
  "heads,kv_heads,layout,implementation",
  [
    (4, 4, "bhsd", "dense"),
    (4, 2, "bhsd", "dense"),
    (6, 1, "bhsd", "dense"),
    (4, 2, "bshd", "dense"),
    (4, 2, "bhsd", "xla"),
    (4, 4, "bshd", "xla"),
  ],
)
def test_attend_cached_equals_attention_over_concatenated_keys(
  heads, kv_heads, layout, implementation
):
  q, k, v, pk, pv, mask = _qkv(np.random.default_rng(0), 2, 5, 7, heads, kv_heads)
  ref = _reference(q, k, v, pk, pv, mask)
  cache = [attention.to_kv_layout(x, layout) for x in (pk, pv)]
  got = attention.attend_cached(q, k, v, *cache, mask, implementation, layout)
  assert got.shape == q.shape
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
  # The mask may also come with a broadcast head axis [B, 1, S, C + S].
  got4 = attention.attend_cached(q, k, v, *cache, mask[:, None], implementation, layout)
  np.testing.assert_allclose(np.asarray(got4), ref, rtol=1e-5, atol=1e-6)


def test_xla_attention_equals_dense_with_an_all_masked_row():
  """`xla` (`jax.nn.dot_product_attention`) gives a fully masked query row the dense path's
  uniform average over all keys, and the same outputs elsewhere."""
  q, k, v, _, _, mask = _qkv(np.random.default_rng(2), 2, 6, 0, 4, 4)
  for m in (mask, mask[:, None], np.broadcast_to(mask[:, None], (2, 4) + mask.shape[1:])):
    dense = np.asarray(attention.attend(q, k, v, m, "dense"))
    np.testing.assert_allclose(
      np.asarray(attention.attend(q, k, v, m, "xla")), dense, rtol=1e-5, atol=1e-6
    )
  np.testing.assert_allclose(
    dense[0, 0], np.broadcast_to(v[0].mean(0), dense[0, 0].shape), rtol=1e-5, atol=1e-6
  )


def test_attend_cached_errors():
  q, k, v, pk, pv, mask = _qkv(np.random.default_rng(1), 1, 2, 3, 4, 3)
  with pytest.raises(ValueError, match="do not group"):
    attention.attend_cached(q, k, v, pk, pv, mask)
  with pytest.raises(ValueError, match="unknown kv_layout"):
    attention.to_kv_layout(k, "bsdh")


def _step_inputs(cfg, c=5, pn=2, a=3):
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, cfg.vocab_size, (1, c + pn + a)).astype(np.int32)
  positions = np.array([[0, 1, 2, 6, 3, 4, 9, 5, 7, 8]], np.int32)
  step_mask = np.asarray(
    masks.cached_step_mask(np.ones((1, c), bool), np.ones((1, pn), bool), np.ones((1, a), bool))
  )
  prefix_mask = np.tril(np.ones((c, c), bool))[None]
  return tokens, positions, step_mask, prefix_mask, c


@pytest.mark.parametrize(
  "backbone", ["dit", pytest.param("dit_scan", marks=pytest.mark.slow), "qwen3_gqa"]
)
def test_cached_step_is_the_same_in_both_layouts(backbone):
  """Prefix encoded into a cache, then one step over it: logits and new kv agree between the
  seq-major and the head-major cache (the kv transposed), and with the uncached forward."""
  if backbone.startswith("dit"):
    cfg = DiTConfig(
      vocab_size=48,
      hidden_size=32,
      num_layers=2,
      num_heads=4,
      cond_dim=16,
      dropout=0.0,
      scan_layers=backbone == "dit_scan",
    )
    model = DiT(cfg)
  else:
    cfg = Qwen3Config(
      vocab_size=48,
      hidden_size=32,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
      intermediate_size=48,
      dropout=0.0,
    )
    model = Qwen3(cfg)
  params = random_params(cfg)
  tokens, positions, step_mask, prefix_mask, c = _step_inputs(cfg)
  run = jax.jit(
    lambda p, t, q, m, kv, layout: model.apply(
      {"params": p}, t, q, m, kv_cache=kv, return_kv=True, kv_layout=layout
    ),
    static_argnames="layout",
  )
  full = np.zeros((1, tokens.shape[1], tokens.shape[1]), bool)
  full[:, :c, :c] = prefix_mask
  full[:, c:] = step_mask
  uncached, _ = run(params, tokens, positions, full, None, layout="bshd")
  out = {}
  for layout in attention.KV_LAYOUTS:
    _, kv = run(params, tokens[:, :c], positions[:, :c], prefix_mask, None, layout=layout)
    out[layout] = run(params, tokens[:, c:], positions[:, c:], step_mask, kv, layout=layout)
    np.testing.assert_allclose(out[layout][0], np.asarray(uncached)[:, c:], rtol=1e-5, atol=1e-5)
  (seq_logits, seq_kv), (head_logits, head_kv) = out["bshd"], out["bhsd"]
  np.testing.assert_allclose(head_logits, seq_logits, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(seq_kv), jax.tree_util.tree_leaves(head_kv)):
    np.testing.assert_allclose(np.swapaxes(np.asarray(b), 1, 2), a, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="unknown kv_layout"):
    model.apply({"params": params}, tokens, positions, full, kv_layout="heads")


@pytest.mark.parametrize("batch", [1, 3])
def test_append_on_the_slot_axis_of_a_head_major_cache(batch):
  rng = np.random.default_rng(4)
  h, cap, s, dh = 2, 9, 3, 4
  like = {"k": np.zeros((batch, h, s, dh), np.float32)}
  cache = cache_lib.empty_cache(like, cap, seq_axis=2)
  assert cache.kv["k"].shape == (batch, h, cap, dh) and cache.capacity == cap
  expect = np.zeros((batch, h, cap, dh), np.float32)
  lengths = np.zeros(batch, int)
  for _ in range(2):
    new = rng.standard_normal((batch, h, s + 1, dh)).astype(np.float32)
    pos = rng.integers(0, 50, (batch, s + 1)).astype(np.int32)
    count = rng.integers(0, s + 1, batch).astype(np.int32)
    cache = jax.jit(cache_lib.append, static_argnames="num_rows")(
      cache, {"k": new}, pos, count, num_rows=s
    )
    for b in range(batch):  # all s slots are written; the length advances by count
      expect[b, :, lengths[b] : lengths[b] + s] = new[b, :, :s]
      lengths[b] += count[b]
    assert cache.seq_axis == 2
    np.testing.assert_array_equal(np.asarray(cache.length), lengths)
    for b in range(batch):
      n = lengths[b]
      np.testing.assert_array_equal(np.asarray(cache.kv["k"])[b, :, :n], expect[b, :, :n])
  with pytest.raises(ValueError, match="seq_axis"):
    cache_lib.empty_cache(like, cap, seq_axis=0)


def test_backbone_adapter_caches_head_major():
  cfg = DiTConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, dropout=0.0)
  fwd = cache_lib.as_forward(DiT(cfg), random_params(cfg))
  assert cache_lib.cache_seq_axis(fwd) == 2
  tokens = jnp.arange(4, dtype=jnp.int32)[None] + 3
  c, _ = jax.eval_shape(
    lambda: cache_lib.prefill(fwd, tokens, jnp.arange(4)[None], jnp.ones((1, 4), bool), capacity=6)
  )
  assert c.seq_axis == 2 and c.kv[0][0].shape == (1, 4, 6, 8)
  assert models.empty_kv(cfg, 1, 6, kv_layout="bhsd")[0][0].shape == (1, 4, 6, 8)
  # A plain logits_fn keeps the seq-major cache.
  toy = cache_lib.as_forward(lambda t, p, m, kv: (jnp.zeros(t.shape + (5,)), {"k": p[..., None]}))
  assert cache_lib.cache_seq_axis(toy) == 1
