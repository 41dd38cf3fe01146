"""Generation orders: which positions are revealed when (SPEC §1.2, §1.3).

Set Diffusion trains on one random *order* per sequence. The order is induced by per-position
"first-hitting" (reveal) times T_i of a staggered masking schedule: token i is masked at diffusion
time t exactly when T_i < t, so running time from 1 down to 0, a larger T means revealed earlier.
The training order is the stable descending argsort of T.

Everything that touches reveal times runs in float64, as the reference does (SPEC §8.4): in a
jitted function this uses `jax.enable_x64` for the few L-sized arrays involved only.

Kinds of order (`sample_order(kind=...)`):
  staggered      SetDLM: the sliding-window schedule of SPEC §1.2.
  left_to_right  AR: the identity permutation.
  uniform        MDLM-style: a uniform random permutation.
  blocks         BD3LM-style: blocks of `block_size` left to right, uniform order inside a block.

They are the orders of the four methods in the paper's unified view; each method's loss draws its
own (SetDLM: staggered), so these kinds serve the tests of that view and custom training code.
MDLM and BD3LM train on masks rather than explicit orders: their noise draw, one diffusion time
per block (`sample_mask_times`), is here too.

In every kind, the leading run of non-permutable positions (BOS under `keep_clean_bos`, prompt /
context tokens) comes first and the trailing run (padding) comes last, both in index order.
"""

from __future__ import annotations

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

ORDER_KINDS = ("staggered", "left_to_right", "uniform", "blocks")


def effective_max_set_size(desired_set_size: int, max_set_size: int | None = None) -> int:
  """S_max as a number: None / 0 means 2S, the released setting (the one default in the code)."""
  return 2 * int(desired_set_size) if not max_set_size else int(max_set_size)


def staggered_params(
  length: int,
  desired_set_size: int,
  max_set_size: int | None = None,
  *,
  k: float | None = None,
  b: float | None = None,
) -> Tuple[float, float]:
  """Window width b and exponent k of the staggered schedule (SPEC §1.2).

  Args:
    length: schedule span B (the context length L for every SetDLM run).
    desired_set_size: S, the expected number of partially-noised tokens is S/2.
    max_set_size: S_max, the overlap window (default 2S).
    k, b: optional explicit overrides, as in the reference constructor (k wins over b).

  Returns:
    (b, k) as Python floats.
  """
  s = desired_set_size
  s_max = effective_max_set_size(s, max_set_size)
  if not 1 <= s <= length:
    raise ValueError(f"desired_set_size={s} must be in [1, length={length}]")
  if s_max > length:
    raise ValueError(
      f"max_set_size={s_max} exceeds length={length}; use max_set_size <= length "
      f"(for a uniform MDLM-style order set desired_set_size = max_set_size = length)"
    )
  if s_max < s:
    raise ValueError(f"max_set_size={s_max} must be >= desired_set_size={s}")
  area = s / (2.0 * length)
  if k is not None:
    b = area * (k + 1.0) / k
  elif b is not None:
    k = area / (b - area)
  elif s not in (1, s_max):
    b = s_max / (length + s_max - 1.0)
    k = area / (b - area)
  else:
    k, b = 1.0, 2.0 * area
  if b > 1.0 + 1e-12:
    raise ValueError(f"staggered schedule window b={b} > 1 (length={length}, S={s}, S_max={s_max})")
  if abs(k / (k + 1.0) * b - area) > 1e-6:
    raise ValueError(f"inconsistent staggered schedule: k/(k+1)*b={k / (k + 1) * b} != a={area}")
  return float(b), float(k)


def staggered_locs(length: int, b: float, num_positions: int | None = None) -> np.ndarray:
  """Window starts loc_i = (1-b)(1 - i/(B-1)), float64 [n]; the *last* n of a length-B schedule."""
  n = length if num_positions is None else num_positions
  i = np.arange(length, dtype=np.float64)
  locs = (1.0 - b) * (1.0 - i / max(length - 1, 1))
  return locs[length - n :]


def staggered_reveal_times(
  exponentials, desired_set_size: int, max_set_size: int | None = None, *, length: int | None = None
):
  """First-hitting times T_i = loc_i + b (1 - exp(-E_i / k)), float64 (SPEC §1.2).

  Args:
    exponentials: Exp(1) draws, [..., n] (last axis = positions). NumPy or jax arrays; jax arrays
      must be float64 (call inside `jax.enable_x64(True)`).
    desired_set_size, max_set_size: S and S_max.
    length: schedule span B (default n). With n < B the last n locs are used, i.e. the n positions
      are the tail of a length-B sequence, as the reference does at inference.

  Returns:
    T with the shape of `exponentials`, float64.
  """
  xp = jnp if isinstance(exponentials, jax.Array) else np
  n = exponentials.shape[-1]
  span = n if length is None else length
  b, k = staggered_params(span, desired_set_size, max_set_size)
  locs = staggered_locs(span, b, n)
  e = xp.asarray(exponentials, dtype=xp.float64)
  return xp.asarray(locs) + b * (-xp.expm1(-e / k))


def staggered_move_chance(
  t,
  desired_set_size: int,
  max_set_size: int | None = None,
  *,
  length: int,
  num_positions: int | None = None,
) -> np.ndarray:
  """Marginal mask probability 1 - alpha_t^i per position, float64 NumPy [..., n] (SPEC §1.2)."""
  b, k = staggered_params(length, desired_set_size, max_set_size)
  locs = staggered_locs(length, b, num_positions)
  u = (np.asarray(t, np.float64)[..., None] - locs) / b
  eps = np.finfo(np.float64).eps
  inside = -np.expm1(k * np.log1p(-np.clip(u, 0.0, 1.0 - eps)))
  p = np.where(u <= 0, 0.0, np.where(u >= 1, 1.0, inside))
  if desired_set_size == 1:  # hard AR mask
    p = np.where(p > 0, 1.0, p)
  return p


def edge_runs(flag: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Leading and trailing runs of True along the last axis.

  Returns (leading, trailing), bool like `flag`: leading[i] is True iff flag[0..i] are all True;
  trailing[i] iff flag[i..n-1] are all True.
  """
  flag = flag.astype(bool)
  leading = jnp.cumprod(flag.astype(jnp.int32), axis=-1).astype(bool)
  trailing = jnp.flip(jnp.cumprod(jnp.flip(flag, -1).astype(jnp.int32), axis=-1), -1).astype(bool)
  return leading, trailing


def order_from_keys(keys: jax.Array, permutable: jax.Array) -> jax.Array:
  """Stable descending argsort of `keys` with the forced edges of SPEC §1.2.

  Non-permutable positions of the leading run get +inf (first, index order), those of the trailing
  run -inf (last, index order); others keep their key.

  Args:
    keys: float [..., n] (larger = earlier).
    permutable: bool [..., n].
  Returns:
    int32 [..., n]: order[r] = position revealed at rank r.
  """
  fixed = ~permutable.astype(bool)
  leading, trailing = edge_runs(fixed)
  # A row with no permutable position is all leading; it keeps index order.
  keys = jnp.where(leading, jnp.inf, jnp.where(trailing & ~leading, -jnp.inf, keys))
  return jnp.argsort(-keys, axis=-1, stable=True).astype(jnp.int32)


def _exponential_float64(bits: jax.Array) -> jax.Array:
  """Exp(1) draws with 53 random mantissa bits from two uint32 words, float64 [...].

  Call inside `jax.enable_x64(True)`. (Drawing float64 directly with jax.random inside a jitted
  function that is otherwise 32-bit does not lower, so the bits are drawn in 32-bit mode.)
  """
  hi = (bits[0] >> 5).astype(jnp.float64)  # 27 bits
  lo = (bits[1] >> 6).astype(jnp.float64)  # 26 bits
  u = (hi * 67108864.0 + lo) / 9007199254740992.0  # uniform on [0, 1) with 2^-53 spacing
  return -jnp.log1p(-u)


@functools.partial(
  jax.jit, static_argnames=("kind", "desired_set_size", "max_set_size", "block_size", "length")
)
def sample_order(
  rng: jax.Array,
  permutable: jax.Array,
  *,
  kind: str = "staggered",
  desired_set_size: int = 1,
  max_set_size: int | None = None,
  block_size: int = 1,
  length: int | None = None,
) -> jax.Array:
  """Samples one generation order per row (batched, jittable).

  Args:
    rng: PRNG key.
    permutable: bool [B, n]; False for context / forced-clean BOS (leading run) and padding
      (trailing run).
    kind: one of ORDER_KINDS.
    desired_set_size, max_set_size: S and S_max for `staggered`.
    block_size: block size for `blocks`.
    length: schedule span for `staggered` (default n).
  Returns:
    int32 [B, n] permutations; order[b, r] is the position revealed at rank r.
  """
  n = permutable.shape[-1]
  if kind == "staggered":
    bits = jax.random.bits(rng, (2,) + permutable.shape, dtype=jnp.uint32)
    with jax.enable_x64(True):
      e = _exponential_float64(bits)
      keys = staggered_reveal_times(e, desired_set_size, max_set_size, length=length)
      return order_from_keys(keys, permutable)
  if kind == "left_to_right":
    keys = -jnp.broadcast_to(jnp.arange(n, dtype=jnp.float32), permutable.shape)
  elif kind == "uniform":
    keys = jax.random.uniform(rng, permutable.shape)
  elif kind == "blocks":
    # Block index dominates, the uniform draw in [0, 1) orders positions inside a block.
    block = (jnp.arange(n) // block_size).astype(jnp.float32)
    keys = -block + jax.random.uniform(rng, permutable.shape)
  else:
    raise ValueError(f"unknown order kind {kind!r}; expected one of {ORDER_KINDS}")
  return order_from_keys(keys, permutable)


def sample_mask_times(
  rng: jax.Array,
  batch_size: int,
  length: int,
  block: int,
  *,
  antithetic: bool = False,
  eps: float = 1e-3,
) -> jax.Array:
  """Per-token diffusion time t [B, L] of MDLM (block = L) / BD3LM (SPEC §1.6).

  One u ~ U[0, 1) per block of `block` tokens, optionally antithetic over the batch
  (u_b = (u_b + b) / B mod 1), then t = (1 - eps) u + eps.
  """
  num_blocks = -(-length // block)
  u = jax.random.uniform(rng, (batch_size, num_blocks))
  if antithetic:
    g = batch_size
    u = jnp.mod(u / g + jnp.arange(g, dtype=jnp.float32)[:, None] / g, 1.0)
  t = (1.0 - eps) * u + eps
  return jnp.repeat(t, block, axis=-1)[:, :length]


def move_eos_last(order: jax.Array, tokens: jax.Array, target: jax.Array, eos_id: int) -> jax.Array:
  """`setdlm_eos_last_in_target_order` (SPEC §1.4): context, target non-EOS, target EOS, pads.

  Each group keeps its sampled relative order. `target` is bool [B, n] over positions
  (real, non-context tokens); `tokens` int [B, n].
  """
  tok = jnp.take_along_axis(tokens, order, -1)
  tgt = jnp.take_along_axis(target.astype(bool), order, -1)
  rank = jnp.arange(order.shape[-1])
  first_target = jnp.argmax(tgt, axis=-1)[..., None]
  group = jnp.where(tgt, jnp.where(tok == eos_id, 2, 1), jnp.where(rank < first_target, 0, 3))
  perm = jnp.argsort(group, axis=-1, stable=True)
  return jnp.take_along_axis(order, perm, -1)


def inverse_permutation(order: jax.Array) -> jax.Array:
  """rank[b, i] = r such that order[b, r] = i."""
  return jnp.argsort(order, axis=-1).astype(jnp.int32)


def expected_active_tokens(
  length: int, desired_set_size: int, max_set_size: int | None = None
) -> float:
  """C = B * b * k/(k+1) = S/2: mean number of partially-noised tokens (SPEC §1.2)."""
  b, k = staggered_params(length, desired_set_size, max_set_size)
  return length * b * k / (k + 1.0)


def num_partially_noised(
  reveal_times: np.ndarray,
  t,
  desired_set_size: int,
  max_set_size: int | None = None,
  *,
  length: int | None = None,
) -> np.ndarray:
  """Tokens masked at time t whose window is still open: T_i < t < loc_i + b.

  These are the masked tokens with a move chance strictly below 1 (the "active" set of the sliding
  window); their expected number over t ~ U(0, 1) is B b k/(k+1) = S/2 (SPEC §1.2).

  Args:
    reveal_times: float64 [..., n]; t: float or array broadcastable to [...].
  Returns:
    int counts [...].
  """
  n = reveal_times.shape[-1]
  span = n if length is None else length
  b, _ = staggered_params(span, desired_set_size, max_set_size)
  locs = staggered_locs(span, b, n)
  t = np.asarray(t, np.float64)[..., None]
  return np.sum((reveal_times < t) & (t < locs + b), axis=-1)


__all__ = [
  "ORDER_KINDS",
  "sample_mask_times",
  "staggered_params",
  "staggered_locs",
  "staggered_reveal_times",
  "staggered_move_chance",
  "edge_runs",
  "order_from_keys",
  "sample_order",
  "move_eos_last",
  "inverse_permutation",
  "expected_active_tokens",
  "num_partially_noised",
]
