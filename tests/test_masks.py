"""Conformance tests for setdiff_jax.diffusion.masks (SPEC §2, §11.3), incl. the gradient-leak test."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_params as _random_params
from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion import losses
from setdiff_jax.models.dit import DiT, DiTConfig


pytestmark = pytest.mark.usefixtures("fast_compile")

# SPEC §2.3, typed in: rows = queries, cols = keys; slots 0-5 clean, 6-11 noisy.
SPEC_L6 = np.array(
  [
    [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
    [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0],
    [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1],
  ],
  dtype=bool,
)

# BD3LM mask (SPEC §2.7), L = 4, block 2, by hand: slots 0-3 clean (blocks 0,0,1,1), 4-7 noisy.
BD3_L4_S2 = np.array(
  [
    [1, 1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 0, 1, 1, 0, 0],
    [1, 1, 0, 0, 0, 0, 1, 1],
    [1, 1, 0, 0, 0, 0, 1, 1],
  ],
  dtype=bool,
)


def np_set_causal(length):
  """The SPEC §2.2 rule with explicit loops."""
  m = np.zeros((2 * length, 2 * length), bool)
  for q in range(2 * length):
    for k in range(2 * length):
      rq, rk, nq, nk = q % length, k % length, q >= length, k >= length
      m[q, k] = (
        (not nq and not nk and rk <= rq) or (nq and not nk and rk < rq) or (nq and nk and rk == rq)
      )
  return m


def np_block_causal(length, bs):
  m = np.zeros((2 * length, 2 * length), bool)
  for q in range(2 * length):
    for k in range(2 * length):
      bq, bk, nq, nk = (q % length) // bs, (k % length) // bs, q >= length, k >= length
      m[q, k] = (
        (not nq and not nk and bk <= bq) or (nq and not nk and bk < bq) or (nq and nk and bk == bq)
      )
  return m


def test_set_causal_spec_l6():
  m = masks.set_causal_mask(6)
  assert m.shape == (12, 12) and m.dtype == bool
  np.testing.assert_array_equal(m, SPEC_L6)


@pytest.mark.parametrize("length", [1, 3, 8])
def test_set_causal_rule(length):
  np.testing.assert_array_equal(masks.set_causal_mask(length), np_set_causal(length))


def test_block_causal_hand_case():
  np.testing.assert_array_equal(masks.block_causal_mask(4, 2), BD3_L4_S2)


@pytest.mark.parametrize("length,bs", [(8, 4), (12, 3), (6, 6)])
def test_block_causal_rule(length, bs):
  np.testing.assert_array_equal(masks.block_causal_mask(length, bs), np_block_causal(length, bs))


@pytest.mark.parametrize("length", [2, 6, 9])
def test_block_size_one_is_set_causal(length):
  np.testing.assert_array_equal(masks.block_causal_mask(length, 1), masks.set_causal_mask(length))


def test_block_causal_rejects_non_divisor():
  with pytest.raises(ValueError):
    masks.block_causal_mask(6, 4)


def test_simple_masks():
  np.testing.assert_array_equal(masks.causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(masks.bidirectional_mask(2), np.ones((2, 2), bool))
  valid = np.array([[1, 1, 0], [1, 0, 0]], bool)
  pm = np.asarray(masks.padding_mask(valid))
  np.testing.assert_array_equal(pm[0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(pm[1], [[1, 0, 0], [0, 0, 0], [0, 0, 0]])
  tp = np.asarray(masks.two_stream_padding(valid))
  v2 = np.concatenate([valid, valid], -1)
  np.testing.assert_array_equal(tp, v2[:, :, None] & v2[:, None, :])


# ------------------------------------------------------------------------------------ §2.8
SPEC_STEP = np.array(
  [  # keys c0 c1 c2 x4 | x3 M5 M6; queries x3, M5, M6
    [1, 1, 1, 1, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 1, 0, 1],
  ],
  dtype=bool,
)


def test_cached_step_mask_spec_example():
  m = np.asarray(
    masks.cached_step_mask(np.ones((1, 4), bool), np.ones((1, 1), bool), np.ones((1, 2), bool))
  )
  assert m.shape == (1, 3, 7)
  np.testing.assert_array_equal(m[0], SPEC_STEP)


def test_cached_step_mask_invalid_slots():
  # Same step in fixed-capacity buffers: cache 6 slots (4 valid, at 0,1,3,4), pending 2 (first
  # valid), active 3 (first two valid). Keys: [cache 6 | pending 2 | active 3].
  cache = np.array([[1, 1, 0, 1, 1, 0]], bool)
  pend = np.array([[1, 0]], bool)
  act = np.array([[1, 1, 0]], bool)
  m = np.asarray(masks.cached_step_mask(cache, pend, act))[0]
  assert m.shape == (5, 11)
  keys = [0, 1, 3, 4, 6, 8, 9]  # the valid keys, in the SPEC's order c0 c1 c2 x4 | x3 M5 M6
  q_valid = [0, 2, 3]  # x3, M5, M6
  np.testing.assert_array_equal(m[np.ix_(q_valid, keys)], SPEC_STEP)
  invalid_keys = [2, 5, 7, 10]
  assert not m[np.ix_(q_valid, invalid_keys)].any()
  # Invalid query rows (pending slot 1 -> row 1, active slot 2 -> row 4) are never read; they
  # include themselves so no row is empty, and never see invalid keys other than themselves.
  assert m[1, 7] and m[4, 10]
  assert not m[1, [2, 5, 10]].any() and not m[4, [2, 5, 7]].any()


def test_cached_step_mask_batched_rows_independent():
  rng = np.random.default_rng(0)
  cache = rng.random((3, 5)) < 0.6
  pend = np.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
  act = np.array([[1, 1], [1, 0], [1, 1]], bool)
  m = np.asarray(masks.cached_step_mask(cache, pend, act))
  for b in range(3):
    for qi in range(5):
      q_is_mask, q_ok = qi >= 3, (np.concatenate([pend[b], act[b]]))[qi]
      for ki in range(5 + 3 + 2):
        if ki < 5:
          exp = cache[b, ki]
        else:
          j = ki - 5
          k_ok = np.concatenate([pend[b], act[b]])[j]
          if j == qi:
            exp = True
          elif q_is_mask:
            exp = bool(k_ok and j < 3)
          else:
            exp = bool(k_ok and j < qi)
        assert m[b, qi, ki] == exp, (b, qi, ki, q_ok)


# ------------------------------------------------------------------------------------ gradients
TINY = DiTConfig(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4, dropout=0.0)


def _per_slot_nll_fn(cfg, params, tokens, positions, mask, targets, length):
  """nll of each noisy slot, as a function of an additive perturbation of the embeddings."""
  model = DiT(cfg)

  def f(delta):
    def add_delta(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if context.module.name == "embed" and context.method_name == "__call__":
        out = out + delta
      return out

    with nn.intercept_methods(add_delta):
      logits = model.apply({"params": params}, tokens, positions, mask)
    logp = jax.nn.log_softmax(logits[:, length:], -1)
    return -jnp.take_along_axis(logp, targets[..., None], -1)[0, :, 0]

  return f


def _dependency(f, n_slots, dim):
  jac = jax.jit(jax.jacrev(f))(jnp.zeros((1, n_slots, dim)))  # [L, 1, 2L, D]
  return np.asarray(jnp.abs(jac[:, 0]).sum(-1))  # [L, 2L]


def test_gradient_leak_setdlm():
  """Loss at noisy slot r: zero gradient to clean ranks >= r and to other noisy slots."""
  length = 8
  params = _random_params(TINY)
  cfg = losses.ObjectiveConfig(mask_token_id=3, pad_token_id=0)
  x = jax.random.randint(jax.random.key(1), (1, length), 4, 32)
  order = jnp.array([[0, 5, 2, 7, 1, 3, 6, 4]], jnp.int32)
  inp = losses.setdlm_inputs(cfg, {"tokens": x}, order)
  f = _per_slot_nll_fn(
    TINY, params, inp["tokens"], inp["positions"], inp["mask"], inp["targets"], length
  )
  dep = _dependency(f, 2 * length, TINY.hidden_size)
  expected = np.zeros((length, 2 * length), bool)
  for r in range(length):
    expected[r, :r] = True  # clean tokens ranked strictly earlier
    expected[r, length + r] = True  # its own mask embedding
  assert np.all(dep[~expected] == 0.0), np.argwhere((dep != 0) & ~expected)
  assert np.all(dep[expected] > 1e-6), dep[expected].min()


def test_gradient_leak_bd3lm():
  """BD3LM: noisy position i depends on clean blocks < block(i) and noisy slots of its block."""
  length, bs = 8, 4
  params = _random_params(TINY, seed=3)
  x = jax.random.randint(jax.random.key(2), (1, length), 4, 32)
  xt = x.at[:, 1:3].set(3).at[:, 5].set(3)
  pos = jnp.arange(length)[None]
  mask = jnp.asarray(masks.block_causal_mask(length, bs))[None]
  f = _per_slot_nll_fn(
    TINY, params, jnp.concatenate([x, xt], -1), jnp.concatenate([pos, pos], -1), mask, x, length
  )
  dep = _dependency(f, 2 * length, TINY.hidden_size)
  expected = np.zeros((length, 2 * length), bool)
  for i in range(length):
    blk = i // bs
    expected[i, : blk * bs] = True
    expected[i, length + blk * bs : length + (blk + 1) * bs] = True
  assert np.all(dep[~expected] == 0.0)
  assert np.all(dep[expected] > 1e-6)
