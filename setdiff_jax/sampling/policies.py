"""Commit policies: which of a step's candidates are committed (SPEC §4.2, generalised).

A policy is a pure, jittable function

  fn(s: StepStats, valid bool [B, A], count int32 [B], arg) -> keep bool [B, A]

of the step's per-candidate statistics (`StepStats`: the chosen token and its probability, the
distribution's max-probability, top-2 margin and entropy, the argmax and how many steps in a row it
has been the argmax), the candidates that may commit (`valid`: the active masks) and the schedule
count n_i. Every policy is per row with static shapes, and `commit` (the one function the samplers
call, through `processors.decide`) guarantees:
  - the n_i best candidates under the policy's own ranking are always committed (n_i is a floor, so
    the step budget T still bounds the steps; n_i == 1 with T = N), hence >= 1 commit per live row;
  - n_i == 0 or n_i >= |valid| commits every valid candidate (SPEC §8.13);
  - only valid candidates are committed.
Ties in a ranking go to the leftmost slot (stable sorts).

Registry (`POLICIES`: name -> `Policy(fn, param, token_dependent, stateful, doc)`):
  threshold      (tau)    today's rule: n_i most confident + every candidate with p(chosen) >= tau
                          (tau = CommitPolicy.arg; None = off). Depends on
                          the sampled token (its probability ranks).
  pmax           (tau)    the distribution-only counterpart of `threshold`: the n_i highest
                          max-probabilities + every candidate with max-probability >= tau (None:
                          off). Under sampling it commits what `threshold` would rank by the
                          argmax, whatever token was drawn, so the trajectory likelihood is exact.
  entropy_bound  (gamma)  EB-sampler (Ben-Hamu et al. 2025): sort by max-probability, commit the
                          largest prefix U with sum_U H - max_U H <= gamma (the paper's bound; the
                          first candidate always passes). gamma >= 0, default 0.1.
  factor         (f)      Fast-dLLM's factor rule: the top n by max-probability while the n-th
                          max-probability >= 1 - f / (n + 1). f > 0, default 1.
  margin         (tau)    rank by p1 - p2; also commit every candidate with p1 - p2 >= tau. Without
                          tau it is the official `confidence_margin_based_noising` (the n_i largest
                          margins per step: token for token in MDLM / BD3LM).
  topk           (k)      a fixed number per step: the max(k, n_i) highest max-probabilities;
                          k >= 1, default 2.
  dilated        (d)      a position schedule: the valid slots j with (j - j0) % d == 0, j0 the
                          first valid slot, i.e. W / d commits spread d apart over the window
                          (the next step takes the next residue); the n_i floor takes the leftmost
                          slots, so the decision depends on positions only. d >= 1, default 2.
  stable         (k)      history rule: a position whose argmax has stayed the same for k steps in
                          a row (this one included) is committed; carried state per position
                          (`Carry`). k >= 1, default 2.
Every policy except `threshold` decides from the distributions only (max-probability, margin,
entropy, argmax, positions), never from the sampled token: `token_dependent=False` (what RL with
exact trajectory likelihoods needs). Under greedy decoding the chosen token is the argmax, so
p(chosen) == max-probability and `threshold` ranks like the others.

A new policy is one function plus one registry line.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from setdiff_jax.config import fields as ranges

DEFAULT = "threshold"
FLAG = "--policy_arg"


class StepStats(NamedTuple):
  """Per-candidate statistics of one step, all [B, A]."""

  cand: jax.Array  # int32: the chosen (sampled or argmax) token
  conf: jax.Array  # fp32: its probability
  pmax: jax.Array  # fp32: the distribution's max-probability
  margin: jax.Array  # fp32: p(top1) - p(top2)
  entropy: jax.Array  # fp32: entropy in nats
  argmax: jax.Array  # int32
  streak: jax.Array  # int32: steps in a row (this one included) this argmax held at the position


class Carry(NamedTuple):
  """Per-position state carried across steps (history rules): [B, L] each."""

  argmax: jax.Array  # int32, -1 where never seen
  streak: jax.Array  # int32


@dataclasses.dataclass(frozen=True)
class Param:
  """A policy's parameter: its name, kind ('float' | 'int'), default, bounds, whether None is ok."""

  name: str
  kind: str = "float"
  default: Optional[float] = None
  low: Optional[float] = None
  low_open: bool = False  # low itself is out of range
  high: Optional[float] = None
  allow_none: bool = False


@dataclasses.dataclass(frozen=True)
class Policy:
  fn: Callable
  param: Param
  token_dependent: bool
  stateful: bool = False
  doc: str = ""


# ----------------------------------------------------------------------------- helpers
def ranks(score: jax.Array, valid: jax.Array) -> jax.Array:
  """Rank of every slot in descending score among the valid ones (invalid last; ties leftmost)."""
  order = jnp.argsort(-jnp.where(valid, score, -jnp.inf), axis=-1, stable=True)
  return jnp.argsort(order, axis=-1)


def sorted_by(score: jax.Array, valid: jax.Array, *xs: jax.Array):
  """(order, valid_sorted, xs sorted): slots in descending score, invalid ones last."""
  order = jnp.argsort(-jnp.where(valid, score, -jnp.inf), axis=-1, stable=True)
  take = lambda x: jnp.take_along_axis(x, order, -1)
  return (order, take(valid)) + tuple(take(x) for x in xs)


def prefix(ok_sorted: jax.Array, order: jax.Array) -> jax.Array:
  """The longest all-True prefix of ok_sorted [B, A], mapped back to slots."""
  run = jnp.cumprod(ok_sorted.astype(jnp.int32), axis=-1) > 0
  rank = jnp.argsort(order, axis=-1)
  return jnp.take_along_axis(run, rank, -1)


def top_n(score: jax.Array, valid: jax.Array, n: jax.Array) -> jax.Array:
  """The n [B] best valid slots by score."""
  return (ranks(score, valid) < n[:, None]) & valid


def with_floor(keep: jax.Array, score: jax.Array, valid: jax.Array, count: jax.Array):
  """keep | the n_i best by score | everything when n_i == 0 or n_i >= |valid|; only valid."""
  n_valid = jnp.sum(valid, -1)
  keep_all = (count == 0) | (count >= n_valid)
  return (keep | top_n(score, valid, count) | keep_all[:, None]) & valid


# ----------------------------------------------------------------------------- policies
def threshold(s: StepStats, valid, count, tau):
  """The predict-and-noise rule (SPEC §4.2): the n_i most confident valid slots (confidence = the
  chosen token's probability) plus every valid slot with confidence >= tau (tau > 1 or None: off);
  n_i == 0 or n_i >= |valid| keeps all valid slots. The reference's non-stable sort leaves ties
  unspecified; here they go to the leftmost slot."""
  on = tau is not None and tau <= 1.0
  return with_floor(s.conf >= tau if on else jnp.zeros_like(valid), s.conf, valid, count)


def pmax(s: StepStats, valid, count, tau):
  """`threshold` with the distribution's max-probability in place of the chosen token's
  probability: the n_i valid slots with the highest max-probability plus every valid slot with
  max-probability >= tau (tau > 1 or None: off). The decision never reads the sampled token, which
  RL with exact trajectory likelihoods needs (issue 28); greedy, it equals `threshold`."""
  on = tau is not None and tau <= 1.0
  return with_floor(s.pmax >= tau if on else jnp.zeros_like(valid), s.pmax, valid, count)


def entropy_bound(s: StepStats, valid, count, gamma):
  order, vs, hs = sorted_by(s.pmax, valid, jnp.where(valid, s.entropy, 0.0))
  excess = jnp.cumsum(hs, -1) - jax.lax.cummax(hs, axis=hs.ndim - 1)
  return with_floor(prefix(vs & (excess <= gamma), order), s.pmax, valid, count)


def factor(s: StepStats, valid, count, f):
  order, vs, ps = sorted_by(s.pmax, valid, s.pmax)
  n = jnp.arange(1, ps.shape[-1] + 1, dtype=jnp.float32)[None]
  return with_floor(prefix(vs & (ps >= 1.0 - f / (n + 1.0)), order), s.pmax, valid, count)


def margin(s: StepStats, valid, count, tau):
  keep = jnp.zeros_like(valid) if tau is None else s.margin >= tau
  return with_floor(keep, s.margin, valid, count)


def topk(s: StepStats, valid, count, k):
  return with_floor(top_n(s.pmax, valid, jnp.full(count.shape, int(k))), s.pmax, valid, count)


def dilated(s: StepStats, valid, count, d):
  a = valid.shape[-1]
  j = jnp.arange(a)[None]
  j0 = jnp.where(jnp.any(valid, -1), jnp.argmax(valid, -1), 0)[:, None]
  first = -j.astype(jnp.float32)  # ranks by position: the floor takes the leftmost slots
  return with_floor(((j - j0) % int(d)) == 0, jnp.broadcast_to(first, valid.shape), valid, count)


def stable(s: StepStats, valid, count, k):
  return with_floor(s.streak >= int(k), s.pmax, valid, count)


# tau of every policy with one: a probability (or a margin of two) in the launchers' shared range
_TAU = Param(
  "tau",
  default=None,
  low=ranges.SHARED["threshold"].lo,
  low_open=True,
  high=ranges.SHARED["threshold"].hi,
  allow_none=True,
)

POLICIES = {
  "threshold": Policy(
    threshold,
    _TAU,
    token_dependent=True,
    doc="n_i most confident + p(chosen) >= tau",
  ),
  "entropy_bound": Policy(
    entropy_bound,
    Param("gamma", default=0.1, low=0.0),
    token_dependent=False,
    doc="EB-sampler prefix: sum H - max H <= gamma",
  ),
  "factor": Policy(
    factor,
    Param("f", default=1.0, low=0.0, low_open=True),
    token_dependent=False,
    doc="top n while p_(n) >= 1 - f / (n + 1)",
  ),
  "margin": Policy(
    margin,
    _TAU,
    token_dependent=False,
    doc="rank by p1 - p2; + margin >= tau",
  ),
  "topk": Policy(
    topk,
    Param("k", kind="int", default=2, low=1),
    token_dependent=False,
    doc="max(k, n_i) per step",
  ),
  "dilated": Policy(
    dilated,
    Param("d", kind="int", default=2, low=1),
    token_dependent=False,
    doc="slots d apart from the first valid one",
  ),
  "stable": Policy(
    stable,
    Param("k", kind="int", default=2, low=1),
    token_dependent=False,
    stateful=True,
    doc="argmax unchanged for k steps",
  ),
  "pmax": Policy(
    pmax,
    _TAU,
    token_dependent=False,
    doc="n_i highest max-probability + pmax >= tau",
  ),
}


# ----------------------------------------------------------------------------- lookup, checks
def get(name: str, flag: str = "--policy") -> Policy:
  if name not in POLICIES:
    raise ValueError(f"{flag}={name!r} is not a commit policy; valid: {', '.join(POLICIES)}")
  return POLICIES[name]


def check_arg(name: str, arg, flag: str = FLAG, policy_flag: str = "--policy") -> Optional[float]:
  """The validated parameter of policy `name` (None -> its default); a ValueError names the
  parameter as `flag` and the policy as `policy_flag` (how the caller's user spells them)."""
  p = get(name).param
  of = f"for {policy_flag}={name}"
  if arg is None:
    return p.default
  try:
    x = float(arg)
  except (TypeError, ValueError):
    raise ValueError(f"{flag}={arg!r} {of}: {p.name} must be a number") from None
  if not math.isfinite(x):  # inf passes every lower bound: say what is wrong with it
    raise ValueError(f"{flag}={arg} {of}: {p.name} must be a finite number")
  if p.kind == "int":
    if x != int(x):
      raise ValueError(f"{flag}={arg} {of}: {p.name} must be an integer")
    x = int(x)
  bad_low = p.low is not None and (x <= p.low if p.low_open else x < p.low)
  if bad_low or (p.high is not None and x > p.high):
    rel = ">" if p.low_open else ">="
    high = "" if p.high is None else f" and <= {p.high:g}"
    raise ValueError(f"{flag}={arg} {of}: {p.name} must be {rel} {p.low:g}{high}")
  return x


def parse_arg(text, flag: str = FLAG) -> Optional[float]:
  """A command-line policy_arg: 'off' / 'none' / '' -> None, else a number (ValueError naming
  `flag`)."""
  if text is None:
    return None
  t = str(text).strip().lower()
  if t in ("", "off", "none", "default"):
    return None
  try:
    return float(t)
  except ValueError:
    raise ValueError(f"{flag}={text!r} is not a number (or 'off')") from None


def label(name: str, arg) -> str:
  """'threshold tau=0.9', 'entropy_bound gamma=0.1', 'margin tau=off'."""
  p = get(name).param
  value = check_arg(name, arg)
  return f"{name} {p.name}={'off' if value is None else f'{value:g}'}"


# ----------------------------------------------------------------------------- statistics, state
def distribution_stats(probs: jax.Array):
  """(pmax, margin, entropy, argmax) of probabilities [..., V]."""
  top2 = jax.lax.top_k(probs, 2)[0]
  plogp = jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0)
  return (
    top2[..., 0],
    top2[..., 0] - top2[..., 1],
    -jnp.sum(plogp, -1),
    jnp.argmax(probs, -1).astype(jnp.int32),
  )


def carry_init(batch: int, length: int) -> Carry:
  return Carry(
    argmax=jnp.full((batch, length), -1, jnp.int32), streak=jnp.zeros((batch, length), jnp.int32)
  )


def streaks(carry: Optional[Carry], pos: jax.Array, argmax: jax.Array) -> jax.Array:
  """Streak of each slot's argmax at positions pos [B, A] given the carried state (1 = new)."""
  if carry is None:
    return jnp.ones_like(argmax)
  pc = jnp.clip(pos, 0, carry.argmax.shape[1] - 1)
  prev = jnp.take_along_axis(carry.argmax, pc, -1)
  run = jnp.take_along_axis(carry.streak, pc, -1)
  return jnp.where(prev == argmax, run + 1, 1)


def carry_update(
  carry: Carry, pos: jax.Array, valid: jax.Array, argmax: jax.Array, streak: jax.Array
) -> Carry:
  """Writes the valid slots' argmax / streak at their positions (others dropped)."""
  b, length = carry.argmax.shape
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], pos.shape)
  where = jnp.where(valid, pos, length)
  return Carry(
    argmax=carry.argmax.at[rows, where].set(argmax, mode="drop"),
    streak=carry.streak.at[rows, where].set(streak, mode="drop"),
  )


# ----------------------------------------------------------------------------- the entry point
def token_dependent(name: str) -> bool:
  """Whether policy `name` reads the sampled token (then a rollout's likelihood is not the product
  of its committed tokens' probabilities; see the module doc)."""
  return get(name).token_dependent


def commit(name: str, arg, s: StepStats, valid: jax.Array, count: jax.Array) -> jax.Array:
  """The commit mask bool [B, A] of policy `name` (arg already validated, static)."""
  return get(name).fn(s, valid, count, arg)


__all__ = [
  "StepStats",
  "Carry",
  "Param",
  "Policy",
  "POLICIES",
  "DEFAULT",
  "get",
  "check_arg",
  "parse_arg",
  "label",
  "distribution_stats",
  "carry_init",
  "streaks",
  "carry_update",
  "commit",
  "ranks",
  "top_n",
  "with_floor",
  "token_dependent",
]
