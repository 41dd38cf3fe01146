"""Conformance tests for setdiff_jax.diffusion.losses (SPEC §1.4-1.6, §11.4).

Each loss is re-computed in NumPy float64 from logits obtained by calling `DiT.apply` on inputs
built here by hand (tokens, positions, attention masks), following the SPEC formulas. For MDLM /
BD3LM the diffusion time and the masking are random inside the objective; the raw uniform draws
are re-derived from the documented key split (t, mask, remask, dropout) and everything computed
from them (t, x_t, re-masking, loss) is done here in NumPy.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import random_params as params_for
from setdiff_jax import objectives
from setdiff_jax.diffusion import losses
from setdiff_jax.diffusion import orders
from setdiff_jax.models.dit import DiT, DiTConfig


pytestmark = pytest.mark.usefixtures("fast_compile")

V, MASK, PAD, BOS, EOS = 32, 3, 0, 1, 2
L = 8
CFG_PLAIN = DiTConfig(
  vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, cond_dim=16, dropout=0.0
)
CFG_ADALN = dataclasses.replace(CFG_PLAIN, adaln=True)


@functools.lru_cache(maxsize=None)
def jitted_apply(cfg):
  return jax.jit(lambda p, t, pos, m: DiT(cfg).apply({"params": p}, t, pos, m))


@functools.lru_cache(maxsize=None)
def jitted_loss(cfg, model_cfg, train):
  """The objective under jit (one compile per shape), with the model params as an argument."""
  fn = lambda p, batch, rng: objectives.compute_loss(
    cfg, DiT(model_cfg), p, batch, rng, train=train
  )
  return jax.jit(fn)


def run_loss(cfg, model_cfg, batch, rng, train):
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  return jitted_loss(cfg, model_cfg, train)(params_for(model_cfg), batch, rng)


def logits_np(cfg, tokens, positions, mask):
  z = jitted_apply(cfg)(
    params_for(cfg),
    jnp.asarray(tokens, jnp.int32),
    jnp.asarray(positions, jnp.int32),
    jnp.asarray(mask, bool),
  )
  return np.asarray(z, np.float64)


def log_softmax_np(z, suppress=None):
  z = z.copy()
  if suppress is not None:
    z[..., suppress] = -1e12
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def gather(a, idx):
  return np.take_along_axis(a, idx[..., None], -1)[..., 0]


def outer(valid):
  return valid[:, :, None] & valid[:, None, :]


# Row 0: BOS, text containing a real token equal to the pad id, 2 pads. Row 1: full, with EOS.
TOKENS = np.array([[BOS, 7, PAD, 9, 12, 5, PAD, PAD], [BOS, 8, 10, 11, 13, 14, 15, EOS]])
ATTN = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8])


# ------------------------------------------------------------------------------------ SetDLM
def np_set_causal(length):
  r = np.arange(2 * length) % length
  n = np.arange(2 * length) >= length
  rq, rk, nq, nk = r[:, None], r[None, :], n[:, None], n[None, :]
  return (~nq & ~nk & (rk <= rq)) | (nq & ~nk & (rk < rq)) | (nq & nk & (rk == rq))


def np_setdlm_loss(tokens, attn, context, order, *, train, keep_clean_bos):
  """SPEC §1.4 steps 1-11 in NumPy (weights permuted with the order)."""
  bsz, length = tokens.shape
  real = attn.astype(bool)
  target = real & ~context.astype(bool)
  noisy = np.where(target, MASK, tokens)
  xs, ns = np.take_along_axis(tokens, order, -1), np.take_along_axis(noisy, order, -1)
  valid = np.take_along_axis(real, order, -1)
  mask = np_set_causal(length)[None] & outer(np.concatenate([valid, valid], -1))
  z = logits_np(CFG_PLAIN, np.concatenate([xs, ns], -1), np.concatenate([order, order], -1), mask)
  nll = -gather(log_softmax_np(z[:, length:], MASK), xs)
  w = np.take_along_axis(target, order, -1).astype(np.float64)
  if not train:
    if keep_clean_bos:
      w[:, 0] = 0
    w = w * (xs != PAD)
  per_seq = np.where(w.sum(-1) > 0, (w * nll).sum(-1) / np.maximum(w.sum(-1), 1e-30), 0.0)
  return per_seq.mean(), w.sum(), (w * nll).sum()


SET_ORDER = np.array([[0, 3, 1, 5, 2, 4, 6, 7], [0, 1, 2, 6, 3, 7, 5, 4]])
SET_CONTEXT = np.array([[0] * 8, [1, 1, 1, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("train", [True, False])
def test_setdlm_loss_matches_numpy(train):
  cfg = losses.ObjectiveConfig(mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=True)
  batch = {
    "tokens": jnp.asarray(TOKENS),
    "attention_mask": jnp.asarray(ATTN),
    "context_mask": jnp.asarray(SET_CONTEXT),
    "order": jnp.asarray(SET_ORDER),
  }
  loss, metrics = run_loss(cfg, CFG_PLAIN, batch, jax.random.key(0), train)
  ref, count, nll_sum = np_setdlm_loss(
    TOKENS, ATTN, SET_CONTEXT, SET_ORDER, train=train, keep_clean_bos=True
  )
  # hand count: train = 6 real (BOS incl.) + 5 non-context; eval drops the BOS and the pad-id token
  assert count == (11 if train else 9)
  assert float(metrics["num_tokens"]) == count
  assert float(loss) == pytest.approx(ref, rel=1e-5)
  assert float(metrics["nll_sum"]) == pytest.approx(nll_sum, rel=1e-5)
  assert float(metrics["num_sequences"]) == 2


def test_setdlm_eval_without_keep_clean_bos_keeps_slot0():
  cfg = losses.ObjectiveConfig(mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=False)
  batch = {
    "tokens": jnp.asarray(TOKENS),
    "attention_mask": jnp.asarray(ATTN),
    "order": jnp.asarray(SET_ORDER),
  }
  loss, metrics = run_loss(cfg, CFG_PLAIN, batch, jax.random.key(0), False)
  ref, count, _ = np_setdlm_loss(
    TOKENS, ATTN, np.zeros_like(TOKENS), SET_ORDER, train=False, keep_clean_bos=False
  )
  assert count == 5 + 8 and float(metrics["num_tokens"]) == count
  assert float(loss) == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("train", [True, False])
def test_setdlm_padding_invariance(train):
  """A padded sequence (explicit order) has the loss of the unpadded sequence alone."""
  cfg = losses.ObjectiveConfig(mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=True)
  tokens = np.array([[BOS, 7, 20, 9, 12, 5, PAD, PAD, PAD]])
  order = np.array([[0, 4, 1, 5, 2, 3, 6, 7, 8]])
  padded = {
    "tokens": jnp.asarray(tokens),
    "attention_mask": jnp.asarray((np.arange(9) < 6)[None]),
    "order": jnp.asarray(order),
  }
  alone = {
    "tokens": jnp.asarray(tokens[:, :6]),
    "attention_mask": jnp.ones((1, 6), jnp.int32),
    "order": jnp.asarray(order[:, :6]),
  }
  lp, mp = run_loss(cfg, CFG_PLAIN, padded, jax.random.key(0), train)
  la, ma = run_loss(cfg, CFG_PLAIN, alone, jax.random.key(0), train)
  assert float(lp) == pytest.approx(float(la), abs=1e-5)
  assert float(mp["num_tokens"]) == float(ma["num_tokens"]) == (6 if train else 5)
  assert float(lp) > 0.5  # a real loss, not an empty one


def test_setdlm_inputs_layout():
  cfg = losses.ObjectiveConfig(mask_token_id=MASK, pad_token_id=PAD)
  batch = {
    "tokens": jnp.asarray(TOKENS),
    "attention_mask": jnp.asarray(ATTN),
    "context_mask": jnp.asarray(SET_CONTEXT),
  }
  inp = losses.setdlm_inputs(cfg, batch, jnp.asarray(SET_ORDER))
  # row 0 by hand: order [0,3,1,5,2,4,6,7]
  np.testing.assert_array_equal(
    inp["tokens"][0],
    [BOS, 9, 7, 5, PAD, 12, PAD, PAD, MASK, MASK, MASK, MASK, MASK, MASK, PAD, PAD],
  )
  # row 1: context positions 0-2 keep their tokens in the noisy stream
  np.testing.assert_array_equal(inp["tokens"][1, 8:], [BOS, 8, 10, MASK, MASK, MASK, MASK, MASK])
  np.testing.assert_array_equal(inp["positions"][0], np.tile(SET_ORDER[0], 2))
  np.testing.assert_array_equal(inp["target_weight"][1], [0, 0, 0, 1, 1, 1, 1, 1])
  valid = np.concatenate([ATTN[0], ATTN[0]]).astype(bool)
  np.testing.assert_array_equal(inp["mask"][0], np_set_causal(8) & outer(valid[None])[0])


def test_setdlm_sampled_orders_and_weights():
  """keep_clean_bos puts position 0 first; prefix context first, padding last, so the permuted
  weights equal the unpermuted ones (the reference's shortcut, SPEC §2.5 / §11.4)."""
  cfg = losses.ObjectiveConfig(
    mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=True, desired_set_size=2
  )
  bsz = 64
  rng = np.random.default_rng(0)
  tokens = rng.integers(4, V, (bsz, L))
  ctx_len = rng.integers(0, 3, bsz)
  real_len = rng.integers(4, L + 1, bsz)
  attn = np.arange(L)[None] < real_len[:, None]
  context = np.arange(L)[None] < ctx_len[:, None]
  batch = {
    "tokens": jnp.asarray(tokens),
    "attention_mask": jnp.asarray(attn),
    "context_mask": jnp.asarray(context),
  }
  order = np.asarray(losses.setdlm_order(cfg, batch, jax.random.key(3), train=True))
  assert np.all(order[:, 0] == 0)
  for b in range(bsz):
    n_fixed = max(ctx_len[b], 1)
    np.testing.assert_array_equal(order[b, :n_fixed], np.arange(n_fixed))
    np.testing.assert_array_equal(order[b, real_len[b] :], np.arange(real_len[b], L))
  target = attn & ~context
  inp = losses.setdlm_inputs(cfg, batch, jnp.asarray(order))
  np.testing.assert_array_equal(inp["target_weight"], target)
  np.testing.assert_array_equal(np.take_along_axis(target, order, -1), target)
  # The orders are not trivial.
  assert np.mean(np.any(order != np.arange(L), -1)) > 0.5


def test_setdlm_eos_last_in_training_only():
  cfg = losses.ObjectiveConfig(
    mask_token_id=MASK, pad_token_id=PAD, eos_token_id=EOS, desired_set_size=4, eos_last=True
  )
  tokens = np.tile([BOS, 7, EOS, 9, 12, 5, EOS, 20], (32, 1))
  batch = {"tokens": jnp.asarray(tokens)}
  order = np.asarray(losses.setdlm_order(cfg, batch, jax.random.key(1), train=True))
  np.testing.assert_array_equal(np.sort(order[:, -2:], -1), np.tile([2, 6], (32, 1)))
  ev = np.asarray(losses.setdlm_order(cfg, batch, jax.random.key(1), train=False))
  assert np.any(np.sort(ev[:, -2:], -1) != [2, 6])


# ------------------------------------------------------------------------------------ AR
def test_ar_loss_matches_numpy():
  cfg = losses.ObjectiveConfig(name="ar", mask_token_id=MASK, pad_token_id=PAD)
  n = L - 1
  z = logits_np(
    CFG_PLAIN, TOKENS[:, :-1], np.tile(np.arange(n), (2, 1)), np.tril(np.ones((n, n), bool))[None]
  )
  nll = -gather(log_softmax_np(z), TOKENS[:, 1:])  # no M suppression in the AR loss
  w = ATTN[:, :-1].astype(np.float64)  # label j+1 weighted by the input-side a_j
  ref = ((w * nll).sum(-1) / w.sum(-1)).mean()
  assert w.sum() == 6 + 7  # row 0: labels x1..x5 plus the first pad x6
  for train in (True, False):
    loss, metrics = run_loss(
      cfg, CFG_PLAIN, {"tokens": TOKENS, "attention_mask": ATTN}, jax.random.key(0), train
    )
    assert float(loss) == pytest.approx(ref, rel=1e-5)
    assert float(metrics["num_tokens"]) == 13


def test_ar_does_not_suppress_mask_logit():
  # A model that puts mass on M: the AR loss of a target M is finite (it is not -1e12 suppressed).
  cfg = losses.ObjectiveConfig(name="ar", mask_token_id=MASK, pad_token_id=PAD)
  tokens = np.array([[BOS, MASK, 7, 8]])
  loss, _ = run_loss(cfg, CFG_PLAIN, {"tokens": tokens}, jax.random.key(0), False)
  assert np.isfinite(float(loss)) and float(loss) < 10


# ------------------------------------------------------------------------------------ MDLM / BD3LM
def np_block_causal(length, bs):
  blk = (np.arange(2 * length) % length) // bs
  n = np.arange(2 * length) >= length
  bq, bk, nq, nk = blk[:, None], blk[None, :], n[:, None], n[None, :]
  return (~nq & ~nk & (bk <= bq)) | (nq & ~nk & (bk < bq)) | (nq & nk & (bk == bq))


def derive_noise(
  rng, name, tokens, attn, *, train, block, keep_clean_bos=True, eps=1e-3, context=None
):
  """t and x_t (SPEC §1.6) from the raw uniform draws of the objective's key split.

  Returns (t, x_t, number of re-masked blocks).
  """
  bsz, length = tokens.shape
  context = np.zeros((bsz, length), bool) if context is None else context.astype(bool)
  t_rng, mask_rng, remask_rng, _ = jax.random.split(rng, 4)
  nb = -(-length // block)
  u = np.asarray(jax.random.uniform(t_rng, (bsz, nb)), np.float64)
  t = np.repeat((1 - eps) * u + eps, block, -1)[:, :length]
  um = np.asarray(jax.random.uniform(mask_rng, (bsz, length)), np.float64)
  real = attn.astype(bool)
  xt = np.where((um < t) & real & ~context, MASK, tokens)  # context is never masked
  if keep_clean_bos:
    xt[:, 0] = tokens[:, 0]
  remasked = 0
  if name == "bd3lm" and train:
    count_rng, subset_rng = jax.random.split(remask_rng)
    count = np.asarray(jax.random.randint(count_rng, (bsz, nb, 1), 0, block))[..., 0] + 1
    us = np.asarray(jax.random.uniform(subset_rng, (bsz, nb, block)))
    for b in range(bsz):
      for j in range(nb):
        sl = slice(j * block, (j + 1) * block)
        # blocks touched by padding or context are left alone (SPEC §1.6 step 3)
        if not np.any(xt[b, sl] == MASK) and np.all(real[b, sl] & ~context[b, sl]):
          chosen = np.argsort(us[b, j])[: count[b, j]]  # the count smallest draws
          xt[b, j * block + chosen] = MASK
          remasked += 1
    if keep_clean_bos:
      xt[:, 0] = tokens[:, 0]
  return t, xt, remasked


def np_masked_diffusion_loss(
  name, tokens, attn, t, xt, *, train, block, keep_clean_bos=True, context=None
):
  bsz, length = tokens.shape
  real = attn.astype(bool)
  target = real if context is None else real & ~context.astype(bool)
  pos = np.tile(np.arange(length), (bsz, 1))
  if name == "mdlm":
    z = logits_np(CFG_ADALN, xt, pos, outer(real))
  else:
    mask = np_block_causal(length, block)[None] & outer(np.concatenate([real, real], -1))
    z = logits_np(
      CFG_ADALN, np.concatenate([tokens, xt], -1), np.concatenate([pos, pos], -1), mask
    )[:, length:]
  m = xt == MASK
  nll = np.where(m, -gather(log_softmax_np(z, MASK), tokens), 0.0)
  w = target.astype(np.float64)
  if train:
    per = np.where(m.sum(-1) > 0, (w * nll).sum(-1) / np.maximum(m.sum(-1), 1), 0.0)
    return per.mean(), m.sum()
  if keep_clean_bos:
    nll, w, t = nll[:, 1:], w[:, 1:], t[:, 1:]
  per = (w * nll / t).sum(-1) / w.sum(-1)
  return per.mean(), w.sum()


@pytest.mark.parametrize(
  "name,train,seed",
  [("mdlm", True, 0), ("mdlm", False, 0), ("bd3lm", True, 4), ("bd3lm", False, 0)],
)
def test_masked_diffusion_matches_numpy(name, train, seed):
  block = 4 if name == "bd3lm" else L
  cfg = losses.ObjectiveConfig(
    name=name, mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=True, block_size=4
  )
  rng = jax.random.key(seed)
  t, xt, remasked = derive_noise(rng, name, TOKENS, ATTN, train=train, block=block)
  m = xt == MASK
  assert m.any() and (~m & (ATTN == 1)).any()  # a non-trivial case
  assert np.all(xt[:, 0] == BOS) and np.all(xt[ATTN == 0] == PAD)
  if name == "bd3lm" and train:
    assert remasked > 0  # the case exercises re-masking
  ref, count = np_masked_diffusion_loss(name, TOKENS, ATTN, t, xt, train=train, block=block)
  batch = {"tokens": jnp.asarray(TOKENS), "attention_mask": jnp.asarray(ATTN)}
  loss, metrics = run_loss(cfg, CFG_ADALN, batch, rng, train)
  assert float(loss) == pytest.approx(ref, rel=1e-5)
  # train: divided by #masked; eval: by #real tokens without the BOS (the pad-id token counts)
  assert float(metrics["num_tokens"]) == (count if train else 5 + 7)


@pytest.mark.parametrize("name,train,seed", [("bd3lm", True, 3), ("mdlm", False, 0)])
def test_masked_diffusion_with_context(name, train, seed):
  """Prompt tokens (context_mask) are never masked and carry no weight; BD3LM's re-masking leaves
  every block that holds context alone (SPEC §1.6)."""
  block = 4 if name == "bd3lm" else L
  cfg = losses.ObjectiveConfig(
    name=name, mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=True, block_size=4
  )
  context = np.array([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0]], bool)
  rng = jax.random.key(seed)
  t, xt, remasked = derive_noise(rng, name, TOKENS, ATTN, train=train, block=block, context=context)
  assert remasked == 0  # every block holds context or padding here
  assert (xt == MASK).any() and np.all(xt[context] == TOKENS[context])
  ref, count = np_masked_diffusion_loss(
    name, TOKENS, ATTN, t, xt, train=train, block=block, context=context
  )
  batch = {"tokens": TOKENS, "attention_mask": ATTN, "context_mask": context}
  loss, metrics = run_loss(cfg, CFG_ADALN, batch, rng, train)
  assert float(metrics["num_tokens"]) == count
  assert float(loss) == pytest.approx(ref, rel=1e-5)


def test_mdlm_eval_without_keep_clean_bos():
  cfg = losses.ObjectiveConfig(
    name="mdlm", mask_token_id=MASK, pad_token_id=PAD, keep_clean_bos=False
  )
  rng = jax.random.key(4)
  t, xt, _ = derive_noise(rng, "mdlm", TOKENS, ATTN, train=False, block=L, keep_clean_bos=False)
  ref, count = np_masked_diffusion_loss(
    "mdlm", TOKENS, ATTN, t, xt, train=False, block=L, keep_clean_bos=False
  )
  loss, metrics = run_loss(cfg, CFG_ADALN, {"tokens": TOKENS, "attention_mask": ATTN}, rng, False)
  assert float(loss) == pytest.approx(ref, rel=1e-5)
  assert count == 14 and float(metrics["num_tokens"]) == 14


def test_sample_t():
  rng = jax.random.key(0)
  u = np.asarray(jax.random.uniform(rng, (4, 3)), np.float64)
  t = np.asarray(orders.sample_mask_times(rng, 4, 12, 4, antithetic=False))
  np.testing.assert_allclose(t, np.repeat(0.999 * u + 1e-3, 4, -1), rtol=1e-6)
  ta = np.asarray(orders.sample_mask_times(rng, 4, 12, 4, antithetic=True))
  ua = np.mod(u / 4 + np.arange(4)[:, None] / 4, 1.0)  # per-row offset b/G
  np.testing.assert_allclose(ta, np.repeat(0.999 * ua + 1e-3, 4, -1), rtol=1e-5)
  # antithetic rows cover disjoint quarters of [0, 1)
  np.testing.assert_array_equal(np.floor(ua * 4), np.tile(np.arange(4)[:, None], (1, 3)))


def test_bd3lm_remask_empty_blocks():
  s, length, n = 4, 16, 4000
  cfg = losses.ObjectiveConfig(name="bd3lm", mask_token_id=MASK, block_size=s, keep_clean_bos=True)
  x = np.arange(10, 26)[None]
  real = np.ones((1, length), bool)
  real[0, 14:] = False
  xt = x.copy()
  xt[0, 5] = MASK  # block 1 already has a mask; blocks 0 and 2 are empty; block 3 has padding

  def f(keys, c):
    one = lambda k: losses.remask_empty_blocks(
      k, jnp.asarray(xt), jnp.asarray(real), jnp.asarray(x), c
    )
    return jax.jit(jax.vmap(one))(keys)

  out = np.asarray(f(jax.random.split(jax.random.key(0), n), cfg))[:, 0]
  assert np.all((out == xt) | (out == MASK))  # only masks are added
  np.testing.assert_array_equal(out[:, 4:8], np.tile(xt[:, 4:8], (n, 1)))  # block with a mask
  np.testing.assert_array_equal(out[:, 12:], np.tile(xt[:, 12:], (n, 1)))  # block with padding
  assert np.all(out[:, 0] == x[0, 0])  # BOS stays clean
  c2 = (out[:, 8:12] == MASK).sum(-1)
  np.testing.assert_array_equal(np.bincount(c2, minlength=5)[0], 0)  # 1..S masks
  freq = np.bincount(c2, minlength=5)[1:] / n
  np.testing.assert_allclose(freq, 0.25, atol=5 * np.sqrt(0.25 * 0.75 / n))
  pos_freq = (out[:, 8:12] == MASK).mean(0)  # uniform subset: each position E[c]/S = 0.625
  np.testing.assert_allclose(pos_freq, 0.625, atol=5 * np.sqrt(0.25 / n))
  # block 0: count n+1 in 1..4 over positions 0..3, then position 0 reset: P(no mask) = 1/16
  c0 = (out[:, :4] == MASK).sum(-1)
  assert c0.max() == 3
  assert abs(np.mean(c0 == 0) - 1 / 16) < 5 * np.sqrt(1 / 16 * 15 / 16 / n)
  # without keep_clean_bos position 0 can be masked and block 0 always gets >= 1 mask
  out_nb = np.asarray(
    f(jax.random.split(jax.random.key(1), 500), dataclasses.replace(cfg, keep_clean_bos=False))
  )[:, 0]
  assert np.all((out_nb[:, :4] == MASK).sum(-1) >= 1) and np.any(out_nb[:, 0] == MASK)


# ------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("name", objectives.NAMES)
def test_loss_decreases_with_adam(name):
  model_cfg = DiTConfig(
    vocab_size=V,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    cond_dim=16,
    dropout=0.0,
    adaln=name in ("mdlm", "bd3lm"),
  )
  cfg = losses.ObjectiveConfig(
    name=name, mask_token_id=MASK, pad_token_id=PAD, desired_set_size=2, block_size=4
  )
  rng = np.random.default_rng(0)
  tokens = np.concatenate([np.full((4, 1), BOS), rng.integers(4, 12, (4, 15))], -1)
  attn = np.ones_like(tokens)
  attn[1, 12:] = 0
  tokens[1, 12:] = PAD
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(attn)}
  model = DiT(model_cfg)
  params = params_for(model_cfg)
  opt = optax.adam(1e-2)
  state = opt.init(params)
  loss_fn = lambda p, k: objectives.compute_loss(cfg, model, p, batch, k, train=True)[0]
  fixed_key = jax.random.key(99)

  @jax.jit
  def step(p, s, k):
    """One Adam step on the loss at key k; also returns the loss of p at a fixed key."""
    (loss, g), fixed = jax.value_and_grad(loss_fn)(p, k), loss_fn(p, fixed_key)
    upd, s = opt.update(g, s, p)
    return optax.apply_updates(p, upd), s, loss, fixed

  step_losses, fixed = [], []
  for i in range(21):
    new_params, new_state, loss, fix = step(params, state, jax.random.fold_in(jax.random.key(1), i))
    fixed.append(float(fix))  # loss at a fixed order / mask draw, before step i
    step_losses.append(float(loss))
    params, state = new_params, new_state
  assert np.all(np.isfinite(step_losses)) and np.all(np.isfinite(fixed))
  assert fixed[-1] < 0.8 * fixed[0], (fixed, step_losses)
  assert np.mean(step_losses[-5:]) < np.mean(step_losses[:5])
