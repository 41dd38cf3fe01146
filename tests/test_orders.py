"""Conformance tests for setdiff_jax.diffusion.orders (SPEC §1.2, §1.3, §11.1-2).

Every expected value is either typed in from the SPEC (hand-worked) or re-computed here in NumPy
float64, independently of the library code.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from setdiff_jax.diffusion import orders


pytestmark = pytest.mark.usefixtures("fast_compile")


# ------------------------------------------------------------------------------------ helpers
def np_params(length, s, s_max=None):
  """(b, k) straight from the SPEC §1.2 formulas (default branch and the S in {1, S_max} branch)."""
  s_max = 2 * s if s_max is None else s_max
  a = s / (2.0 * length)
  if s in (1, s_max):
    return 2 * a, 1.0
  b = s_max / (length + s_max - 1.0)
  return b, a / (b - a)


def np_reveal_times(e, length, s, s_max=None):
  """T_i = loc_i + b (1 - exp(-E_i / k)), float64, loc_i = (1-b)(1 - i/(L-1))."""
  b, k = np_params(length, s, s_max)
  loc = (1.0 - b) * (1.0 - np.arange(length) / (length - 1.0))
  return loc + b * (1.0 - np.exp(-np.asarray(e, np.float64) / k))


def np_order(T):
  """Stable descending argsort (ties keep index order)."""
  return np.argsort(-np.asarray(T), axis=-1, kind="stable")


def ranks(order):
  order = np.asarray(order)
  r = np.empty_like(order)
  np.put_along_axis(r, order, np.broadcast_to(np.arange(order.shape[-1]), order.shape), -1)
  return r


# ------------------------------------------------------------------------------------ §1.2 vector
E_VEC = np.array([0.1, 2.0, 0.05, 0.7, 1.3, 0.2, 3.0, 0.4])
T_VEC = np.array([0.6996, 0.9011, 0.4877, 0.6317, 0.6060, 0.2972, 0.4534, 0.1942])
LOC_VEC = np.array([0.6364, 0.5455, 0.4545, 0.3636, 0.2727, 0.1818, 0.0909, 0.0])


def test_spec_vector_params_and_locs():
  b, k = orders.staggered_params(8, 2, 4)
  assert b == pytest.approx(4.0 / 11.0, abs=1e-15)
  assert k == pytest.approx(0.523810, abs=5e-7)
  # k/(k+1) b = a = S / (2L) = 1/8
  assert k / (k + 1) * b == pytest.approx(1.0 / 8.0, abs=1e-12)
  locs = orders.staggered_locs(8, b)
  assert locs.dtype == np.float64
  np.testing.assert_allclose(locs, LOC_VEC, atol=5e-5)
  # b = S_max * g exactly, g the loc spacing
  np.testing.assert_allclose(-np.diff(locs), b / 4, rtol=1e-12)
  assert locs[0] + b == pytest.approx(1.0, abs=1e-15) and locs[-1] == 0.0
  # The last n locs for n < B (inference on the tail of a length-B sequence).
  np.testing.assert_array_equal(orders.staggered_locs(8, b, 3), locs[5:])


def test_spec_vector_reveal_times_numpy_and_jax():
  T = orders.staggered_reveal_times(E_VEC, 2, 4)
  assert T.dtype == np.float64
  np.testing.assert_allclose(T, T_VEC, atol=5e-5)
  np.testing.assert_allclose(T, np_reveal_times(E_VEC, 8, 2, 4), rtol=1e-14)
  # tail of a length-8 schedule
  np.testing.assert_allclose(
    orders.staggered_reveal_times(E_VEC[5:], 2, 4, length=8), T[5:], rtol=1e-14
  )
  with jax.enable_x64(True):
    tj = orders.staggered_reveal_times(jnp.asarray(E_VEC, jnp.float64), 2, 4)
    assert tj.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(tj), T, rtol=1e-14)


def test_spec_vector_order():
  T = np_reveal_times(E_VEC, 8, 2, 4)
  expected = [1, 0, 3, 4, 2, 6, 5, 7]
  expected_bos = [0, 1, 3, 4, 2, 6, 5, 7]
  np.testing.assert_array_equal(np_order(T), expected)  # NumPy, independent
  bos_fixed = np.ones(8, bool)
  bos_fixed[0] = False
  with jax.enable_x64(True):
    t64 = jnp.asarray(T, jnp.float64)
    np.testing.assert_array_equal(orders.order_from_keys(t64, jnp.ones(8, bool)), expected)
    np.testing.assert_array_equal(orders.order_from_keys(t64, jnp.asarray(bos_fixed)), expected_bos)
    # batched, and a padded tail (positions 6, 7 not permutable) goes last in index order
    pad = np.ones((2, 8), bool)
    pad[1, 6:] = False
    out = np.asarray(orders.order_from_keys(jnp.stack([t64, t64]), jnp.asarray(pad)))
  np.testing.assert_array_equal(out[0], expected)
  np.testing.assert_array_equal(out[1], [1, 0, 3, 4, 2, 5, 6, 7])


def test_order_from_keys_stable_ties():
  keys = jnp.array([[0.5, 0.7, 0.5, 0.7, 0.1]])
  np.testing.assert_array_equal(
    orders.order_from_keys(keys, jnp.ones((1, 5), bool)), [[1, 3, 0, 2, 4]]
  )


def test_spec_vector_move_chance():
  p = orders.staggered_move_chance(0.5, 2, 4, length=8)
  np.testing.assert_allclose(p, [0, 0, 0.0676, 0.2182, 0.4018, 0.6635, 1, 1], atol=5e-5)
  # independent: 1 - (1 - u)^k on the window, float64
  b, k = np_params(8, 2, 4)
  u = (0.5 - (1 - b) * (1 - np.arange(8) / 7)) / b
  ref = np.where(u <= 0, 0, np.where(u >= 1, 1, 1 - (1 - np.clip(u, 0, 1)) ** k))
  np.testing.assert_allclose(p, ref, rtol=1e-12, atol=1e-15)
  # batched t, and the last-n variant
  pb = orders.staggered_move_chance(np.array([0.5, 0.0, 1.0]), 2, 4, length=8)
  np.testing.assert_allclose(pb[0], p, rtol=1e-15)
  np.testing.assert_array_equal(pb[1], np.zeros(8))
  np.testing.assert_array_equal(pb[2], np.ones(8))
  np.testing.assert_allclose(
    orders.staggered_move_chance(0.5, 2, 4, length=8, num_positions=3), p[5:], rtol=1e-15
  )


def test_move_chance_hard_for_s1():
  # L = 8, S = 1: b = 1/8, loc_i = (7 - i)/8. At t = 0.45, u_4 = 0.6 (soft value 0.6) -> hard 1.
  p = orders.staggered_move_chance(0.45, 1, length=8)
  np.testing.assert_array_equal(p, [0, 0, 0, 0, 1, 1, 1, 1])


def test_move_chance_is_cdf_of_reveal_time():
  rng = np.random.default_rng(0)
  n = 40000
  T = orders.staggered_reveal_times(rng.exponential(size=(n, 16)), 4, 8)
  for t in (0.2, 0.55, 0.9):
    emp = np.mean(T < t, axis=0)
    p = orders.staggered_move_chance(t, 4, 8, length=16)
    se = np.sqrt(np.maximum(p * (1 - p), 1e-12) / n)
    assert np.all(np.abs(emp - p) <= 5 * se + 1e-12), (t, emp, p)


# ------------------------------------------------------------------------------------ (b, k) table
SPEC_TABLE = [
  (128, 4, 0.059259, 0.358090),
  (128, 8, 0.111888, 0.387534),
  (128, 16, 0.201258, 0.450425),
  (1024, 4, 0.007759, 0.336378),
  (1024, 8, 0.015399, 0.339876),
  (1024, 16, 0.030332, 0.346925),
  (768, 4, 0.010323, 0.337397),
  (768, 8, 0.020434, 0.342071),
  (768, 16, 0.040050, 0.351518),
]


@pytest.mark.parametrize("length,s,b_ref,k_ref", SPEC_TABLE)
def test_params_table(length, s, b_ref, k_ref):
  b, k = orders.staggered_params(length, s, 2 * s)
  assert abs(b - b_ref) <= 5.1e-7 and abs(k - k_ref) <= 5.1e-7
  assert orders.staggered_params(length, s) == (b, k)  # S_max defaults to 2S
  assert orders.expected_active_tokens(length, s) == pytest.approx(s / 2, rel=1e-12)


def test_params_special_cases_and_overrides():
  assert orders.staggered_params(16, 1) == pytest.approx((1 / 16, 1.0))  # AR: S=1, S_max=2
  assert orders.staggered_params(16, 16, 16) == pytest.approx((1.0, 1.0))  # MDLM: S=S_max=L
  b, k = orders.staggered_params(64, 4, k=0.5)  # b = a (k+1)/k with a = 4/128
  assert (b, k) == pytest.approx((4 / 128 * 3, 0.5))
  b, k = orders.staggered_params(64, 4, b=0.1)  # k = a / (b - a)
  assert (b, k) == pytest.approx((0.1, (4 / 128) / (0.1 - 4 / 128)))
  with pytest.raises(ValueError):
    orders.staggered_params(16, 16)  # S_max = 2L > L
  with pytest.raises(ValueError):
    orders.staggered_params(16, 4, 20)
  with pytest.raises(ValueError):
    orders.staggered_params(16, 0)


# ------------------------------------------------------------------------------------ properties
def test_bounded_overtaking_1000_orders():
  length, s, s_max = 32, 4, 8
  order = np.asarray(
    orders.sample_order(
      jax.random.key(1),
      jnp.ones((1000, length), bool),
      kind="staggered",
      desired_set_size=s,
      max_set_size=s_max,
    )
  )
  assert order.shape == (1000, length) and order.dtype == np.int32
  np.testing.assert_array_equal(np.sort(order, -1), np.broadcast_to(np.arange(length), order.shape))
  r = ranks(order)
  i, j = np.triu_indices(length, 1)
  overtaken = r[:, j] < r[:, i]  # j > i revealed before i
  dist = (j - i)[None, :].repeat(1000, 0)
  assert not np.any(overtaken & (dist >= s_max)), "position j ranked before i with j - i >= S_max"
  # ... and the bound is tight: overtaking by S_max - 1 does happen in 1000 orders.
  assert dist[overtaken].max() == s_max - 1
  assert 0 < overtaken.mean() < 0.2


def _overtake_prob(d, s_max, k):
  """P(position i+d revealed before i) = P(U' - U > d / S_max), U, U' ~ Beta(1, k) i.i.d."""
  c = d / s_max
  val, _ = integrate.quad(lambda u: k * (1 - u) ** (k - 1) * (1 - u - c) ** k, 0, 1 - c, limit=200)
  return val


def test_sampler_matches_float64_simulation():
  """Jitted sampler vs an independent NumPy float64 simulation of T, and exact overtake probs."""
  length, s, s_max, n = 8, 2, 4, 20000
  order = np.asarray(
    orders.sample_order(
      jax.random.key(7),
      jnp.ones((n, length), bool),
      kind="staggered",
      desired_set_size=s,
      max_set_size=s_max,
    )
  )
  rng = np.random.default_rng(123)
  ref_order = np_order(np_reveal_times(rng.exponential(size=(4 * n, length)), length, s, s_max))
  r, r_ref = ranks(order), ranks(ref_order)
  for pos in (0, 3, 5, 7):
    a = np.bincount(r[:, pos], minlength=length)
    b = np.bincount(r_ref[:, pos], minlength=length)
    keep = (a + b) > 0
    _, p, _, _ = stats.chi2_contingency(np.stack([a[keep], b[keep]]))
    assert p > 1e-3, (pos, a, b)
  # Adjacent-overtake probabilities against numerical integration of the Beta(1, k) law.
  _, k = np_params(length, s, s_max)
  for d in (1, 2, 3):
    p = _overtake_prob(d, s_max, k)
    emp = (r[:, d:] < r[:, :-d]).mean(axis=1)  # per row, over pairs (i, i + d)
    se = emp.std(ddof=1) / np.sqrt(n)
    assert abs(emp.mean() - p) < 5 * se, (d, emp.mean(), p)
  assert not np.any(r[:, 4:] < r[:, :-4])  # d >= S_max never


def test_mean_partially_noised_is_half_s():
  length, s, s_max, n = 32, 4, 8, 40000
  rng = np.random.default_rng(5)
  e = rng.exponential(size=(n, length))
  T = np_reveal_times(e, length, s, s_max)
  np.testing.assert_allclose(orders.staggered_reveal_times(e, s, s_max), T, rtol=1e-12, atol=1e-15)
  t = rng.uniform(size=n)
  count = orders.num_partially_noised(T, t, s, s_max)
  b, _ = np_params(length, s, s_max)
  loc = (1 - b) * (1 - np.arange(length) / (length - 1))
  ref = np.sum((T < t[:, None]) & (t[:, None] < loc + b), axis=-1)  # independent count
  np.testing.assert_array_equal(count, ref)
  se = count.std(ddof=1) / np.sqrt(n)
  assert abs(count.mean() - s / 2) < 5 * se, (count.mean(), se)
  assert orders.expected_active_tokens(length, s, s_max) == pytest.approx(s / 2, rel=1e-12)


def test_s1_gives_identity():
  n, length = 500, 16
  out = orders.sample_order(
    jax.random.key(3), jnp.ones((n, length), bool), kind="staggered", desired_set_size=1
  )
  np.testing.assert_array_equal(out, np.broadcast_to(np.arange(length), (n, length)))
  perm = jnp.ones((n, length), bool).at[:, 0].set(False).at[:, 12:].set(False)
  out = orders.sample_order(jax.random.key(4), perm, kind="staggered", desired_set_size=1)
  np.testing.assert_array_equal(out, np.broadcast_to(np.arange(length), (n, length)))


PERMS4 = {p: i for i, p in enumerate(itertools.permutations(range(4)))}


def _perm_chi2_p(order):
  idx = np.array([PERMS4[tuple(row)] for row in np.asarray(order).tolist()])
  counts = np.bincount(idx, minlength=24)
  return stats.chisquare(counts).pvalue, counts


@pytest.mark.parametrize(
  "kind,kwargs", [("staggered", dict(desired_set_size=4, max_set_size=4)), ("uniform", {})]
)
def test_uniform_permutations_chi2(kind, kwargs):
  n = 24000
  order = orders.sample_order(jax.random.key(11), jnp.ones((n, 4), bool), kind=kind, **kwargs)
  p, counts = _perm_chi2_p(order)
  assert p > 1e-3, counts
  assert counts.min() > 800  # every permutation occurs (expected 1000)


def test_uniform_chi2_detects_nonuniform():
  # Power check of the statistic: S=2, S_max=4 on L=4 is far from uniform.
  order = orders.sample_order(
    jax.random.key(11),
    jnp.ones((24000, 4), bool),
    kind="staggered",
    desired_set_size=2,
    max_set_size=4,
  )
  p, _ = _perm_chi2_p(order)
  assert p < 1e-10


# ------------------------------------------------------------------------------------ edge runs
EDGE_ROWS = [  # (leading non-permutable, trailing padding, extra middle non-permutable position)
  (1, 0, None),
  (3, 4, None),
  (0, 5, None),
  (16, 0, None),
  (2, 2, 7),
  (0, 0, None),
]


def _edge_flags(length=16):
  perm = np.ones((len(EDGE_ROWS), length), bool)
  for r, (lead, pad, mid) in enumerate(EDGE_ROWS):
    perm[r, :lead] = False
    if pad:
      perm[r, length - pad :] = False
    if mid is not None:
      perm[r, mid] = False
  return perm


@pytest.mark.parametrize("kind", orders.ORDER_KINDS)
def test_leading_first_trailing_last(kind):
  length = 16
  perm = _edge_flags(length)
  for seed in range(5):
    out = np.asarray(
      orders.sample_order(
        jax.random.key(seed), jnp.asarray(perm), kind=kind, desired_set_size=2, block_size=4
      )
    )
    for r, (lead, pad, mid) in enumerate(EDGE_ROWS):
      row = out[r]
      assert sorted(row.tolist()) == list(range(length))
      np.testing.assert_array_equal(row[:lead], np.arange(lead))
      if pad:
        np.testing.assert_array_equal(row[length - pad :], np.arange(length - pad, length))
      if kind == "left_to_right":
        np.testing.assert_array_equal(row, np.arange(length))  # middle fixed keeps its key
      if kind == "blocks":
        # blocks stay in order (outside the forced leading run and padding)
        blk = row[lead : length - pad] // 4
        assert np.all(np.diff(blk) >= 0), row


def test_middle_nonpermutable_keeps_random_key():
  perm = np.ones((400, 16), bool)
  perm[:, 7] = False
  out = np.asarray(
    orders.sample_order(jax.random.key(0), jnp.asarray(perm), kind="staggered", desired_set_size=4)
  )
  rank7 = ranks(out)[:, 7]
  assert len(np.unique(rank7)) > 2  # not forced to a fixed rank


def test_blocks_uniform_within_block():
  n, length, bs = 6000, 6, 3
  out = np.asarray(
    orders.sample_order(
      jax.random.key(2), jnp.ones((n, length), bool), kind="blocks", block_size=bs
    )
  )
  np.testing.assert_array_equal(out[:, :3] // 3, 0)
  np.testing.assert_array_equal(out[:, 3:] // 3, 1)
  perms = {p: i for i, p in enumerate(itertools.permutations(range(3)))}
  for blk in range(2):
    idx = [perms[tuple((row - 3 * blk).tolist())] for row in out[:, 3 * blk : 3 * blk + 3]]
    assert stats.chisquare(np.bincount(idx, minlength=6)).pvalue > 1e-3


def test_unknown_kind_raises():
  with pytest.raises(ValueError):
    orders.sample_order(jax.random.key(0), jnp.ones((1, 4), bool), kind="random")


# ------------------------------------------------------------------------------------ EOS last
def test_move_eos_last_groups():
  eos = 2
  length, bsz = 12, 6
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 30, size=(bsz, length))
  context = np.zeros((bsz, length), bool)
  real = np.ones((bsz, length), bool)
  for r in range(bsz):
    ctx, pad = r % 3, (r * 2) % 5
    context[r, :ctx] = True
    if pad:
      real[r, length - pad :] = False
      tokens[r, length - pad :] = eos  # pad = EOS id (GPT-2 style): must still go last as padding
    tgt_pos = np.arange(ctx, length - pad)
    tokens[r, rng.choice(tgt_pos, size=2, replace=False)] = eos
  tokens[0, 0] = eos  # an EOS-valued context token stays a context token
  context[0, 0] = True
  target = real & ~context
  order = orders.sample_order(
    jax.random.key(9), jnp.asarray(target), kind="staggered", desired_set_size=2
  )
  out = np.asarray(orders.move_eos_last(order, jnp.asarray(tokens), jnp.asarray(target), eos))
  order = np.asarray(order)
  changed = 0
  for r in range(bsz):
    o = order[r].tolist()
    ctx = [p for p in o if context[r, p]]
    non_eos = [p for p in o if target[r, p] and tokens[r, p] != eos]
    eos_t = [p for p in o if target[r, p] and tokens[r, p] == eos]
    pads = [p for p in o if not real[r, p]]
    expected = ctx + non_eos + eos_t + pads
    np.testing.assert_array_equal(out[r], expected)
    changed += expected != o
  assert changed > 0


def test_inverse_permutation():
  order = orders.sample_order(jax.random.key(0), jnp.ones((4, 10), bool), kind="uniform")
  inv = np.asarray(orders.inverse_permutation(order))
  np.testing.assert_array_equal(inv, ranks(order))
  np.testing.assert_array_equal(
    np.take_along_axis(np.asarray(order), inv, -1), np.broadcast_to(np.arange(10), (4, 10))
  )
