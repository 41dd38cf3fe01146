"""The fused head + cross-entropy (setdiff_jax/models/fused_head.py) against the unfused logits path.

Loss and gradients must agree to 1e-6 relative (fp32): per token on random hidden states (with
and without the suppressed mask column, row chunking, recomputation), and through every objective
(`fused_head=True` vs `False` in the model config, same parameters, same batch, same key).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax import models, objectives
from setdiff_jax.models import fused_head
from setdiff_jax.diffusion import losses
from setdiff_jax.models.dit import DiT, DiTConfig
from setdiff_jax.models.qwen3 import Qwen3Config

pytestmark = pytest.mark.usefixtures("fast_compile")

V, MASK = 37, 3


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def _data(seed=0, n=(3, 7), d=16):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.normal(size=n + (d,)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(d, V)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(V,)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, V, n), jnp.int32)
  weights = jnp.asarray(rng.uniform(size=n), jnp.float32)  # a non-uniform cotangent
  return h, kernel, bias, targets, weights


@pytest.mark.parametrize(
  "suppress,chunk,recompute,vocab_chunk,with_bias",
  [
    (None, None, False, None, True),
    (MASK, None, False, None, True),
    (MASK, 4, False, None, True),
    (MASK, 4, True, None, True),
    (None, 8, True, None, True),
    # vocabulary chunks: V = 37 in 5 chunks of 8 (3 padded columns)
    (MASK, None, False, 8, True),
    (None, None, False, 8, False),
    (MASK, None, False, 64, True),
  ],
)  # one chunk > V: the row path
def test_fused_nll_matches_logits_path(suppress, chunk, recompute, vocab_chunk, with_bias):
  h, kernel, bias, targets, weights = _data()
  targets = targets.at[0, 0].set(MASK)  # a target at the suppressed column: same (huge) NLL
  bias = bias if with_bias else None

  def ref(h, k, b):
    z = jnp.einsum("...d,dv->...v", h, k) + (0.0 if b is None else b)
    return fused_head.reference_nll(z, targets, suppress)

  def fused(h, k, b):
    return fused_head.fused_nll(
      h,
      targets,
      k,
      b,
      suppress_id=suppress,
      chunk_rows=chunk,
      recompute=recompute,
      vocab_chunk=vocab_chunk,
    )

  nll_r, nll_f = jax.jit(ref)(h, kernel, bias), jax.jit(fused)(h, kernel, bias)
  assert nll_f.shape == targets.shape and nll_f.dtype == jnp.float32
  assert rel_err(nll_f, nll_r) < 1e-6
  loss = lambda f: lambda *a: jnp.sum(weights * jnp.where(targets == MASK, 0.0, f(*a)))
  argnums = (0, 1, 2) if with_bias else (0, 1)
  g_r = jax.jit(jax.grad(loss(ref), argnums=argnums))(h, kernel, bias)
  g_f = jax.jit(jax.grad(loss(fused), argnums=argnums))(h, kernel, bias)
  for a, b in zip(g_f, g_r):
    assert rel_err(a, b) < 1e-6


def test_vocab_chunk_conflicts():
  h, kernel, bias, targets, _ = _data()
  with pytest.raises(ValueError, match="vocab_chunk excludes"):
    fused_head.fused_nll(h, targets, kernel, bias, vocab_chunk=8, chunk_rows=4)
  with pytest.raises(ValueError, match="head_vocab_chunk=0"):
    dataclasses.replace(CFG, head_recompute=True)
  with pytest.raises(ValueError, match=">= 0"):
    dataclasses.replace(QWEN, head_vocab_chunk=-1)
  dataclasses.replace(CFG, head_vocab_chunk=0, head_chunk_rows=4, head_recompute=True)  # fine


def test_fused_nll_can_fail():
  """The comparison above is sharp: a wrong target column is caught."""
  h, kernel, bias, targets, _ = _data()
  z = jnp.einsum("...d,dv->...v", h, kernel) + bias
  wrong = fused_head.fused_nll(h, (targets + 1) % V, kernel, bias)
  assert rel_err(wrong, fused_head.reference_nll(z, targets)) > 1e-2


def test_fused_nll_shape_error():
  h, kernel, bias, targets, _ = _data()
  with pytest.raises(ValueError, match="does not match targets"):
    fused_head.fused_nll(h[:, :-1], targets, kernel, bias)


CFG = DiTConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, cond_dim=16, dropout=0.1)


@functools.lru_cache(maxsize=None)
def _loss_and_grad(obj_cfg, model_cfg):
  fn = lambda p, batch, rng: objectives.compute_loss(
    obj_cfg, DiT(model_cfg), p, batch, rng, train=True
  )
  return jax.jit(jax.value_and_grad(fn, has_aux=True))


SLOW = pytest.mark.slow  # the default tier keeps one case per code path; `-m slow` runs the rest


@pytest.mark.parametrize(
  "name,adaln,vocab_chunk",
  [
    ("setdlm", False, 0),
    ("mdlm", True, 8),
    pytest.param("ar", False, 0, marks=SLOW),
    pytest.param("bd3lm", True, 0, marks=SLOW),
  ],
)
def test_objectives_fused_equals_unfused(name, adaln, vocab_chunk):
  model_cfg = dataclasses.replace(CFG, adaln=adaln, fused_head=False, head_vocab_chunk=vocab_chunk)
  obj = losses.ObjectiveConfig(
    name=name, mask_token_id=MASK, pad_token_id=0, eos_token_id=2, desired_set_size=2, block_size=4
  )
  rng = np.random.default_rng(1)
  tokens = rng.integers(4, V, (3, 8)).astype(np.int32)
  tokens[:, 0] = 1
  real = np.ones_like(tokens)
  real[1, 6:] = 0  # padding in one row
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(real)}
  params = random_params(model_cfg)
  for seed in range(3, 10):  # a key under which some token is masked (MDLM draws one t per row)
    key = jax.random.key(seed)
    (loss_u, m_u), g_u = _loss_and_grad(obj, model_cfg)(params, batch, key)
    if float(loss_u) > 0:
      break
  fused_cfg = dataclasses.replace(model_cfg, fused_head=True)
  (loss_f, m_f), g_f = _loss_and_grad(obj, fused_cfg)(params, batch, key)
  assert np.isfinite(float(loss_u)) and float(loss_u) > 0
  assert rel_err(loss_f, loss_u) < 1e-6
  assert rel_err(m_f["nll_sum"], m_u["nll_sum"]) < 1e-6
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_f), jax.tree_util.tree_leaves(g_u)):
    assert rel_err(a, b) < 1e-6, jax.tree_util.keystr(path)


QWEN = Qwen3Config(
  vocab_size=V,
  hidden_size=32,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  intermediate_size=48,
  dropout=0.1,
)


@functools.lru_cache(maxsize=None)
def _qwen_loss_and_grad(obj_cfg, model_cfg):
  fn = lambda p, batch, rng: objectives.compute_loss(
    obj_cfg, models.build(model_cfg), p, batch, rng, train=True
  )
  return jax.jit(jax.value_and_grad(fn, has_aux=True))


@pytest.mark.parametrize("name,tied", [("setdlm", True), pytest.param("ar", False, marks=SLOW)])
def test_qwen3_fused_equals_unfused(name, tied):
  """Qwen3's LM head (tied: the embedding transposed; untied: lm_head) through the fused path."""
  model_cfg = dataclasses.replace(
    QWEN, tie_embeddings=tied, fused_head=False, head_vocab_chunk=8 if tied else 0
  )  # V = 37: 5 chunks
  obj = losses.ObjectiveConfig(
    name=name, mask_token_id=MASK, pad_token_id=0, eos_token_id=2, desired_set_size=2
  )
  rng = np.random.default_rng(2)
  tokens = rng.integers(4, V, (2, 8)).astype(np.int32)
  tokens[:, 0] = 1
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.ones_like(tokens)}
  params = random_params(model_cfg)
  assert ("lm_head" in params) != tied
  key = jax.random.key(5)
  (loss_u, _), g_u = _qwen_loss_and_grad(obj, model_cfg)(params, batch, key)
  (loss_f, _), g_f = _qwen_loss_and_grad(obj, dataclasses.replace(model_cfg, fused_head=True))(
    params, batch, key
  )
  assert np.isfinite(float(loss_u)) and float(loss_u) > 0
  assert rel_err(loss_f, loss_u) < 1e-6
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_f), jax.tree_util.tree_leaves(g_u)):
    assert rel_err(a, b) < 1e-6, jax.tree_util.keystr(path)


def test_qwen3_return_hidden_and_head():
  """return_hidden + output_head reproduce the logits; head_vd is the tied embedding itself."""
  for tied in (True, False):
    cfg = dataclasses.replace(QWEN, tie_embeddings=tied)
    model, params = models.build(cfg), random_params(cfg)
    tokens = jnp.asarray(np.arange(6)[None] % V, jnp.int32)
    pos = jnp.arange(6, dtype=jnp.int32)[None]
    mask = jnp.tril(jnp.ones((1, 6, 6), bool))
    logits = model.apply({"params": params}, tokens, pos, mask, head_start=2)
    h = model.apply({"params": params}, tokens, pos, mask, head_start=2, return_hidden=True)
    kernel, bias = model.output_head(params)
    assert bias is None and h.shape == (1, 4, cfg.hidden_size)
    assert rel_err(jnp.dot(h, kernel), logits) < 1e-6
    assert (
      (model.head_vd(params) is params["embed"]["embedding"])
      if tied
      else (model.head_vd(params) is None)
    )


def test_vocab_chunks_bf16_compute():
  """bf16 matmuls: the chunked path agrees with the row path (same products, another order)."""
  h, kernel, bias, targets, weights = _data()

  def loss(vocab_chunk):
    def f(h, k, b):
      nll = fused_head.fused_nll(
        h, targets, k, b, dtype=jnp.bfloat16, suppress_id=MASK, vocab_chunk=vocab_chunk
      )
      return jnp.sum(weights * nll), nll

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))

  (l_r, nll_r), g_r = loss(None)(h, kernel, bias)
  (l_c, nll_c), g_c = loss(8)(h, kernel, bias)
  assert nll_c.dtype == jnp.float32 and rel_err(nll_c, nll_r) < 1e-2
  for a, b in zip(g_c, g_r):
    assert a.dtype == jnp.float32 and rel_err(a, b) < 2e-2
